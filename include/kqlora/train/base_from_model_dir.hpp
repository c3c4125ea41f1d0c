#pragma once
// A checkpoint written with checkpoint_base = auto stores its base's identity, not the
// base (docs/CHECKPOINTS.md): readers that need the base tensors (kqlora-export) quantize
// it again from the run's hf_model_dir and init_file, as a restart does.

#include <string>

#include "kqlora/io/checkpoint_contents.hpp"

namespace kqlora {

/// With c.base_hash set: the NF4 base and the frozen dense tensors of the run's model,
/// quantized again from its hf_model_dir (and init_file), checked against the hash, put
/// into c (c.nf4, c.params). InputError naming `where` when the directory is not there or
/// the hash differs. Contents that hold their base are left as they are.
void load_base_from_model_dir(CheckpointContents& c, const std::string& where);

}  // namespace kqlora
