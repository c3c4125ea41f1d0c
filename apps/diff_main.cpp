// kqlora-diff: compares checkpoints parameter by parameter (h5diff's exit convention).

#include <cstdio>
#include <iomanip>
#include <iostream>

#include "app_main.hpp"
#include "kqlora/io/checkpoint_diff.hpp"

namespace {

const char* usage =
    "usage: kqlora-diff REF TEST [TEST ...] [--rtol R] [--atol A] [--equal-nan] [--optimizer]\n"
    "\n"
    "Each argument is a checkpoint file or directory (a step directory, or a save_dir meaning\n"
    "its latest). Every TEST file (each rank's file of a per-rank checkpoint) is compared\n"
    "with REF: NF4 components bitwise (the dequantized values' largest difference shown),\n"
    "float tensors with |test - ref| <= atol + rtol*|ref|. FSDP shard files are reassembled,\n"
    "so checkpoints of any layout, world size and parallel mode compare.\n"
    "Prints a line per parameter, then Passed! or Failed!.\n"
    "\n"
    "  --rtol R       relative tolerance (default 1e-4)\n"
    "  --atol A       absolute tolerance (default 1e-4)\n"
    "  --equal-nan    NaN equals NaN\n"
    "  --optimizer    compare the optimizer state too\n"
    "  --version      version and build configuration\n"
    "Exit codes: 0 equal, 1 different, 2 error (unreadable or damaged input).\n";

double parse_tol(const std::string& v, const std::string& flag) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  KQLORA_INPUT_CHECK(!v.empty() && *end == '\0' && x >= 0,
                     flag << ": expected a non-negative number, got '" << v << "'");
  return x;
}

int diff_main(std::vector<std::string>& args) {
  kqlora::DiffOptions o;
  std::string v;
  if (kqlora::app::take_option(args, "--rtol", &v)) o.rtol = parse_tol(v, "--rtol");
  if (kqlora::app::take_option(args, "--atol", &v)) o.atol = parse_tol(v, "--atol");
  o.equal_nan = kqlora::app::take_flag(args, "--equal-nan");
  o.optimizer = kqlora::app::take_flag(args, "--optimizer");
  for (const auto& a : args)
    KQLORA_INPUT_CHECK(a.empty() || a[0] != '-', "unknown option '" << a << "' (see --help)");
  KQLORA_INPUT_CHECK(args.size() >= 2, "expected REF and at least one TEST (see --help)");

  // Read everything first: a damaged file is an error (exit 2), not a difference. FSDP
  // shard files are reassembled into one state; a DDP run's per-rank files each count.
  auto load = [&](const std::string& path) {
    std::vector<std::pair<std::string, kqlora::CheckpointContents>> out;
    const auto files = kqlora::checkpoint_files(path);
    std::vector<kqlora::CheckpointContents> parts;
    for (const auto& f : files) {
      parts.push_back(kqlora::read_checkpoint_file(f, o.optimizer));
      if (parts.back().format_version < 2)
        std::cerr << "warning: " << f << ": " << kqlora::unchecksummed_warning << "\n";
    }
    const bool sharded =
        !parts.front().nf4_shards.empty() ||
        (!parts.front().params.empty() && parts.front().params.front().first_element >= 0);
    if (sharded) {
      out.emplace_back(path + " (" + std::to_string(files.size()) + " FSDP shards reassembled)",
                       kqlora::assemble_checkpoint(parts, path));
    } else {
      for (size_t i = 0; i < files.size(); ++i) out.emplace_back(files[i], std::move(parts[i]));
    }
    return out;
  };
  const auto refs = load(args[0]);
  const auto& ref_name = refs.front().first;
  const auto& ref = refs.front().second;
  std::vector<std::pair<std::string, kqlora::CheckpointContents>> tests;
  for (size_t i = 1; i < args.size(); ++i)
    for (auto& t : load(args[i])) tests.push_back(std::move(t));

  bool all_equal = true;
  std::cout << "reference: " << ref_name << " (step " << ref.step << ", world size "
            << ref.world_size << ")\n";
  for (const auto& [file, test] : tests) {
    std::cout << "test: " << file << " (step " << test.step << ", world size " << test.world_size
              << (test.layout == "per_rank" ? ", rank " + std::to_string(test.rank) : "") << ")\n";
    for (const auto& line : kqlora::diff_checkpoints(ref, test, o)) {
      all_equal &= line.equal;
      std::cout << "  " << (line.equal ? "\u2713" : "\u2718") << " " << std::left << std::setw(36)
                << line.name << std::right;
      if (line.kind == "float") {
        std::cout << " max |diff| " << std::scientific << std::setprecision(3) << line.max_abs
                  << "  max rel " << line.max_rel << std::defaultfloat;
      } else if (line.kind == "nf4") {
        std::cout << " NF4 " << (line.equal ? "bitwise equal " : "") << "(dequantized: max |diff| "
                  << std::scientific << std::setprecision(3) << line.max_abs << ")"
                  << std::defaultfloat;
      }
      if (!line.detail.empty()) std::cout << " " << line.detail;
      std::cout << "\n";
    }
  }
  std::cout << (all_equal ? "Passed!" : "Failed!") << "\n";
  return all_equal ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return kqlora::app::run(argc, argv, "kqlora-diff", usage, diff_main);
}
