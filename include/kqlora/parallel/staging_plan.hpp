#pragma once
// How a collective on host buffers streams through the NCCL backend's bounded staging
// buffers (parallel/nccl_communicator.cpp, kNcclStagingBytes): in pieces of each rank's
// block, so that a piece's device scratch and page-locked host buffer stay within the
// bound whatever the collective's size (the set-up broadcast of a whole model, FSDP's
// gathers through host memory). Plain arithmetic and host copies, tested on CPUs.

#include <cstdint>
#include <vector>

namespace kqlora {

/// Bytes [offset, offset + bytes) of each rank's block.
struct StagingPiece {
  int64_t offset = 0, bytes = 0;
};

/// The pieces of a collective whose per-rank block is `block_bytes`, when a piece's staging
/// holds `blocks` blocks' worth of it (1 for an in-place broadcast or all-reduce, ranks + 1
/// for an all-gather or a reduce-scatter: its send and receive sides), within `cap` bytes,
/// cut at whole elements of `element_bytes`. In order, covering the block; one empty piece
/// for an empty block. InputError-free: a cap below one element per block is a program error.
std::vector<StagingPiece> staging_pieces(int64_t block_bytes, int64_t blocks, int64_t element_bytes,
                                         int64_t cap);

/// Piece `p` of each of `ranks` blocks of `block_bytes` lying end to end at `blocks` (rank
/// r's at r * block_bytes), copied side by side to `packed` ([rank 0's piece | rank 1's |
/// ...], what a reduce-scatter sends and an all-gather receives).
void pack_piece(const char* blocks, int64_t block_bytes, int ranks, StagingPiece p, char* packed);
/// The reverse of pack_piece.
void unpack_piece(const char* packed, int64_t block_bytes, int ranks, StagingPiece p, char* blocks);

}  // namespace kqlora
