// kqlora-train: QLoRA training from an input deck, under mpirun/srun (world size from MPI).

#include <algorithm>
#include <iostream>

#include "app_main.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/runtime.hpp"
#include "kqlora/core/signals.hpp"
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/parallel/world.hpp"
#include "kqlora/train/config.hpp"
#include "kqlora/train/data.hpp"
#include "kqlora/train/memory_check.hpp"
#include "kqlora/train/trainer.hpp"

namespace {

// The key list comes from the deck's key table (train/config.hpp).
std::string usage() {
  return "usage: kqlora-train [--dry-run] DECK [key=value ...]\n"
         "       mpirun -np N kqlora-train DECK [key=value ...]\n"
         "\n"
         "Trains a model (by default the seed's stack of QLoRA linears: NF4 base weights,\n"
         "LoRA adapters) as the input deck describes; key=value arguments override the deck.\n"
         "The world size comes from MPI. The effective configuration is echoed and stored in\n"
         "every checkpoint.\n"
         "Deck: one `key = value` per line, `#` comments. Keys (defaults):\n" +
         kqlora::deck_help() +
         "\n"
         "  --dry-run   print the effective configuration and the memory estimate (per rank,\n"
         "              against 0.9 x the node's memory / its ranks) and exit\n"
         "  --version   version and build configuration\n"
         "SIGTERM or SIGUSR1 (Slurm's --signal) on any rank: stop at the next step boundary,\n"
         "write a checkpoint and exit with code 75; resume with restart=latest.\n"
         "Exit codes: 0 done, 2 bad input (a message names the file and line; nothing written),\n"
         "75 preempted (checkpoint written), 1 other failure (e.g. a non-finite loss with\n"
         "nonfinite = stop, a rank that hung or died).\n";
}

int train_main(std::vector<std::string>& args) {
  const bool dry_run = kqlora::app::take_flag(args, "--dry-run");
  KQLORA_INPUT_CHECK(!args.empty(), "expected a deck file (see --help)");
  const std::string deck = args[0];
  KQLORA_INPUT_CHECK(deck.empty() || deck[0] != '-',
                     "unknown option '" << deck << "' (see --help)");
  std::vector<std::string> overrides(args.begin() + 1, args.end());
  // Rank 0 reads the deck; every rank parses the same text, so all agree on the result
  // (and on the error, which only rank 0 prints).
  std::string text, status = "ok";
  if (kqlora::world_rank() == 0) {
    try {
      text = kqlora::read_deck_file(deck);
    } catch (const kqlora::InputError& e) {
      status = e.what();
    }
  }
  status = kqlora::world_broadcast(status);
  KQLORA_INPUT_CHECK(status == "ok", status);
  text = kqlora::world_broadcast(text);
  const kqlora::Config cfg = kqlora::parse_deck_text(text, deck, overrides, kqlora::world_size());
  if (dry_run) {  // the effective configuration and the memory estimate; nothing else
    const int node = std::max(1, std::min(kqlora::world_size(), kqlora::ranks_on_this_node()));
    const int64_t seq =
        kqlora::model_kind(cfg.model).tokens ? kqlora::token_file_seq_len(cfg.data_file) : 0;
    // (A device build counts each rank's GPU its own here: the run checks again with the
    // ranks that share one.)
    const kqlora::MemoryPlacement placement = kqlora::build_placement(1, false, false);
    kqlora::check_memory(cfg, kqlora::world_size(), node, seq, deck, placement);
    if (kqlora::world_rank() == 0)
      std::cout << cfg.to_deck_text()
                << kqlora::estimate_memory(cfg, kqlora::world_size(), node, seq, placement).report()
                << "\n";
    return 0;
  }
  kqlora::install_stop_handlers();
  const auto summary = kqlora::train(cfg, std::cout);
  return summary.preempted ? kqlora::exit_code_preempted : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kqlora::app::run(argc, argv, "kqlora-train", usage(), train_main);
}
