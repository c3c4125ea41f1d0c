#pragma once
// Whether two config.json files describe the same model (a restart's check, docs/
// CHECKPOINTS.md "Restarts"): their parsed specs are compared, not their bytes, so
// formatting and metadata (transformers_version, architectures, ...) do not matter.

#include <string>

#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora {

/// The first field in which the specs differ, as "<field>: <a's> vs <b's>"; "" when they
/// describe the same numbers (the notes of defaults taken are not compared).
std::string first_spec_difference(const DecoderSpec& a, const DecoderSpec& b);

}  // namespace kqlora
