#pragma once
// MXFP4 (the OCP microscaling format gpt-oss's hub checkpoints store their experts in):
// blocks of 32 values along a row, each an FP4 (E2M1) code in a nibble -- the low nibble
// of byte b the even value 2b, the high nibble the odd one -- and one E8M0 scale byte per
// block, the value code * 2^(scale - 127). transformers' convert_moe_packed_tensors
// decodes the same (docs/MODELS.md, "Experts"). A scale byte of 255 is E8M0's NaN; a
// decoded value past float32's range (6 * 2^127) is an infinity: both are bad input.

#include <cstdint>
#include <string>

namespace kqlora {

/// The 16 FP4 (E2M1) values by code: +0, 0.5, 1, 1.5, 2, 3, 4, 6, then their negatives.
float fp4_value(int code);

/// rows x cols floats into out from blocks [rows, cols / 32, 16] and scales [rows, cols / 32]
/// (cols a multiple of 32). InputError naming `where` and the place of a NaN scale or a
/// non-finite value.
void mxfp4_decode(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t cols,
                  float* out, const std::string& where);

}  // namespace kqlora
