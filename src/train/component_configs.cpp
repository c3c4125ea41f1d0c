#include "kqlora/train/component_configs.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "kqlora/core/error.hpp"

namespace kqlora {

ModelConfig model_config(const Config& c) {
  ModelConfig m;
  m.kind = c.model;
  m.loss = parse_loss(c.loss);
  m.dim = c.dim;
  m.num_layers = c.num_linears;
  m.rank = c.lora_rank;
  m.alpha = c.lora_alpha;
  m.dropout = c.lora_dropout;
  m.bias = c.bias;
  m.activation = parse_activation(c.activation);
  m.dtype = c.dtype;
  m.block_size = c.block_size;
  m.scaler_block_size = c.scaler_block_size;
  m.seed = static_cast<uint64_t>(c.seed);
  m.lora_b_zeros = c.lora_b_init == "zeros";
  m.lora_targets = c.lora_targets;
  m.router_aux_loss = c.router_aux_loss;
  m.hf_model_dir = c.hf_model_dir;
  m.activation_checkpointing = c.activation_checkpointing;
  m.activation_dtype = c.activation_dtype == "bfloat16"  ? ActivationDtype::bfloat16
                       : c.activation_dtype == "float32" ? ActivationDtype::float32
                                                         : ActivationDtype::automatic;
  if (!c.hf_model_dir.empty()) {
    m.arch_source = c.hf_model_dir + "/config.json";
    std::ifstream f(m.arch_source);
    KQLORA_INPUT_CHECK(f.good(), "hf_model_dir " << c.hf_model_dir << ": cannot read config.json: "
                                                 << std::strerror(errno));
    std::stringstream ss;
    ss << f.rdbuf();
    m.arch_text = ss.str();
  }
  return m;
}

OptimizerConfig optimizer_config(const Config& c) {
  OptimizerConfig o;
  o.kind = c.optimizer == "sgd"     ? OptimizerConfig::Kind::sgd
           : c.optimizer == "adamw" ? OptimizerConfig::Kind::adamw
                                    : OptimizerConfig::Kind::adam;
  o.lr = c.lr;
  o.momentum = c.momentum;
  o.beta1 = c.betas[0];
  o.beta2 = c.betas[1];
  o.eps = c.eps;
  o.weight_decay = c.weight_decay;
  return o;
}

DataParallelConfig data_parallel_config(const Config& c, bool fresh) {
  DataParallelConfig d;
  d.parallel = c.parallel;
  d.shared_memory = parse_switch(c.ddp_shared_memory, "ddp_shared_memory");
  d.overlap = parse_switch(c.ddp_overlap, "ddp_overlap");
  d.single_process = c.single_process == "auto";
  d.bucket_mb = c.bucket_mb;
  d.optimizer = optimizer_config(c);
  d.fresh = fresh;
  return d;
}

}  // namespace kqlora
