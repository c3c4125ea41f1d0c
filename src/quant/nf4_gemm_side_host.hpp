#pragma once
// The fused NF4 GEMM's side products (quant/nf4_gemm.hpp, Nf4GemmSideProducts) on one
// packed block of A, private to the library (nf4_gemm_host.cpp calls it after packing a
// block, while the block and its source rows are in cache).

#include <cstdint>

#include "kqlora/quant/nf4_gemm.hpp"

namespace kqlora::impl {

/// The most rows and summed indices of one block (the fused kernel's kMc and kKc at most).
constexpr int64_t kSideMaxRows = 512;
constexpr int64_t kSideMaxKc = 640;

/// s's products over A's block of rows [r0, min(r0 + mc_padded, rows)) and columns
/// [k0, k0 + kc), read from `packed`, the block as [mc_padded / 8][kc][8] micro-panels (rows
/// past `rows` zero). right's rows of the block are written at the first block of k (k0 0)
/// and added to after; left's columns of the block at the first block of rows (r0 0, unless
/// left_accumulate) and added to after.
void nf4_gemm_side_block(const Nf4GemmSideProducts& s, int64_t rows, int64_t r0, int64_t mc_padded,
                         int64_t k0, int64_t kc, const float* packed);

}  // namespace kqlora::impl
