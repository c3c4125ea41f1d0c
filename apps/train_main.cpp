// kqlora-train: QLoRA training from an input deck, under mpirun/srun (world size from MPI).

#include <fstream>
#include <iostream>
#include <sstream>

#include "app_main.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/signals.hpp"
#include "kqlora/io/deck.hpp"
#include "kqlora/parallel/world.hpp"
#include "kqlora/train/trainer.hpp"

namespace {

const char* usage =
    "usage: kqlora-train DECK [key=value ...]\n"
    "       mpirun -np N kqlora-train DECK [key=value ...]\n"
    "\n"
    "Trains a stack of QLoRA linears (NF4 base weights, LoRA adapters) as the input deck\n"
    "describes; key=value arguments override the deck. The world size comes from MPI.\n"
    "The effective configuration is echoed and stored in every checkpoint.\n"
    "Deck: one `key = value` per line, `#` comments. Keys (defaults):\n"
    "  model lora_stack (the registered model kinds), dim 128, num_linears 1, lora_rank dim/2, "
    "lora_alpha 16, lora_dropout 0,\n"
    "  lora_b_init zeros|kaiming (kaiming), bias false, activation none|relu|gelu|silu,\n"
    "  block_size 64, scaler_block_size 256, dtype float32|bfloat16, device auto|host|cuda,\n"
    "  seed 42, global_bs 8, micro_bs global_bs, num_steps 3, loss sum|mse,\n"
    "  optimizer sgd|adam|adamw (adam), lr 1e-2, momentum 0 (sgd), betas 0.9,0.999,\n"
    "  eps 1e-8, weight_decay 0 (adamw 0.01), lr_schedule constant|cosine, warmup_steps 0,\n"
    "  grad_clip 0 (off), nonfinite stop|skip, init_file, data_file, eval_file,\n"
    "  eval_every 0, parallel ddp|fsdp, comm auto|mpi|nccl, ddp_shared_memory auto|on|off,\n"
    "  ddp_overlap auto|on|off, bucket_mb 25, comm_timeout_s 300,\n"
    "  save_dir ./checkpoints, checkpoint_every 0 (end only), checkpoint_layout per_rank|shared,\n"
    "  keep_last 0 (all), restart none|latest|PATH, log_every 1, metrics_file none.\n"
    "\n"
    "  --version   version and build configuration\n"
    "SIGTERM or SIGUSR1 (Slurm's --signal) on any rank: stop at the next step boundary,\n"
    "write a checkpoint and exit with code 75; resume with restart=latest.\n"
    "Exit codes: 0 done, 2 bad input (a message names the file and line; nothing written),\n"
    "75 preempted (checkpoint written), 1 other failure (e.g. a non-finite loss with\n"
    "nonfinite = stop, a rank that hung or died).\n";

int train_main(std::vector<std::string>& args) {
  KQLORA_INPUT_CHECK(!args.empty(), "expected a deck file (see --help)");
  const std::string deck = args[0];
  KQLORA_INPUT_CHECK(deck.empty() || deck[0] != '-',
                     "unknown option '" << deck << "' (see --help)");
  std::vector<std::string> overrides(args.begin() + 1, args.end());
  // Rank 0 reads the deck; every rank parses the same text, so all agree on the result
  // (and on the error, which only rank 0 prints).
  std::string text, status = "ok";
  if (kqlora::world::rank() == 0) {
    std::ifstream f(deck);
    if (!f.good()) {
      status = deck + ": cannot open the deck";
    } else {
      std::stringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    }
  }
  status = kqlora::world::broadcast(status);
  KQLORA_INPUT_CHECK(status == "ok", status);
  text = kqlora::world::broadcast(text);
  const kqlora::Config cfg = kqlora::parse_deck_text(text, deck, overrides, kqlora::world::size());
  kqlora::signals::install_stop_handlers();
  const auto summary = kqlora::train(cfg, std::cout);
  return summary.preempted ? kqlora::signals::exit_code_preempted : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kqlora::app::run(argc, argv, "kqlora-train", usage, train_main);
}
