#include "kqlora/quant/nf4_shard.hpp"

#include <algorithm>

namespace kqlora {

Nf4ShardRange nf4_shard_range(const Nf4Layout& layout, int index, int count) {
  KQLORA_INPUT_CHECK(count >= 1 && index >= 0 && index < count,
                     "NF4 shard " << index << " of " << count << " does not exist");
  const int64_t nsb = layout.num_scaler_blocks(), nb = layout.num_blocks();
  const int64_t sbs = layout.scaler_block_size;
  Nf4ShardRange r;
  r.capacity_scaler_blocks = (nsb + count - 1) / count;
  r.capacity_blocks = r.capacity_scaler_blocks * sbs;
  r.first_scaler_block = std::min<int64_t>(index * r.capacity_scaler_blocks, nsb);
  r.num_scaler_blocks = std::min<int64_t>(r.capacity_scaler_blocks, nsb - r.first_scaler_block);
  r.first_block = std::min<int64_t>(r.first_scaler_block * sbs, nb);
  r.num_blocks = std::min<int64_t>(r.num_scaler_blocks * sbs, nb - r.first_block);
  return r;
}

}  // namespace kqlora
