#include "kqlora/train/base_from_model_dir.hpp"

#include <Kokkos_Core.hpp>

#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/train/checkpointing.hpp"
#include "kqlora/train/config.hpp"
#include "kqlora/train/init.hpp"

namespace kqlora {

void load_base_from_model_dir(CheckpointContents& c, const std::string& where) {
  if (c.base_hash.empty()) return;
  using Exec = Kokkos::DefaultExecutionSpace;
  ModelConfig mc = ModelConfig::from_text(c.model_config_text, where + " (model_config)");
  mc.arch_text = c.arch_text;
  mc.arch_source = where + " (hf_config)";
  KQLORA_INPUT_CHECK(!mc.hf_model_dir.empty(),
                     where << ": the checkpoint stores no base (checkpoint_base = auto) and "
                              "names no hf_model_dir to quantize it from");
  const Config run = parse_deck_text(c.config_text, where + " (config)", {}, 1, false);
  auto model = make_model(Exec(), mc, false);
  std::ostringstream quiet;
  try {
    initialize_model(Exec(), *model, run.init_file, quiet);
  } catch (const InputError& e) {
    KQLORA_INPUT_CHECK(false, where << ": the checkpoint stores no base (checkpoint_base = "
                                    << "auto); quantizing it again from hf_model_dir "
                                    << mc.hf_model_dir << " failed: " << e.what());
  }
  const std::string now = model_base_hash(*model);
  KQLORA_INPUT_CHECK(now == c.base_hash, where << ": the base quantized again from "
                                               << mc.hf_model_dir << " has hash " << now
                                               << ", the checkpoint's base_hash is " << c.base_hash
                                               << " (the model's weights changed since?)");
  for (const ParamEntry* e : model->table().of_kind(ParamKind::nf4))
    c.nf4.emplace_back(e->name, nf4_host(model->nf4[e->offset]));
  for (const ParamEntry* e : model->table().of_kind(ParamKind::dense)) {
    const auto h = model->dense_host(*e);
    c.params.push_back({e->name, e->shape, std::vector<float>(h.data(), h.data() + e->numel())});
  }
}

}  // namespace kqlora
