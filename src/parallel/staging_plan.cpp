#include "kqlora/parallel/staging_plan.hpp"

#include <algorithm>
#include <cstring>

#include "kqlora/core/error.hpp"

namespace kqlora {

std::vector<StagingPiece> staging_pieces(int64_t block_bytes, int64_t blocks, int64_t element_bytes,
                                         int64_t cap) {
  KQLORA_CHECK(
      block_bytes >= 0 && blocks > 0 && element_bytes > 0 && block_bytes % element_bytes == 0,
      "staging_pieces: block of " << block_bytes << " bytes, " << blocks << " blocks, elements of "
                                  << element_bytes);
  const int64_t piece = cap / blocks / element_bytes * element_bytes;
  KQLORA_CHECK(piece > 0, "staging_pieces: " << cap << " bytes cannot stage " << blocks
                                             << " elements of " << element_bytes << " bytes");
  std::vector<StagingPiece> pieces;
  for (int64_t off = 0; off < block_bytes || pieces.empty(); off += piece)
    pieces.push_back({off, std::min(piece, block_bytes - off)});
  return pieces;
}

void pack_piece(const char* blocks, int64_t block_bytes, int ranks, StagingPiece p, char* packed) {
  for (int r = 0; r < ranks; ++r)
    std::memcpy(packed + r * p.bytes, blocks + r * block_bytes + p.offset,
                static_cast<size_t>(p.bytes));
}

void unpack_piece(const char* packed, int64_t block_bytes, int ranks, StagingPiece p,
                  char* blocks) {
  for (int r = 0; r < ranks; ++r)
    std::memcpy(blocks + r * block_bytes + p.offset, packed + r * p.bytes,
                static_cast<size_t>(p.bytes));
}

}  // namespace kqlora
