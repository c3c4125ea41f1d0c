#include "kqlora/train/checkpointing.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <ostream>
#include <sstream>
#include <tuple>

#include "kqlora/core/error.hpp"
#include "kqlora/core/populate_pages.hpp"
#include "kqlora/core/seconds_since.hpp"
#include "kqlora/io/base_hash.hpp"
#include "kqlora/io/shared_checkpoint.hpp"
#include "kqlora/nn/decoder_spec_diff.hpp"
#include "kqlora/train/component_configs.hpp"

namespace kqlora {

namespace {

/// A host copy of a view (the view itself when it is there), complete on return. Device-wide
/// (on CUDA it waits for every stream): checkpoints and restarts run between steps, with no
/// collective in flight (docs/GPU.md).
template <class View>
auto host_copy(const View& v) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);  // device-wide: checkpoint
}

/// The shared layout: one file; each rank writes its part of every dataset (its FSDP
/// shards and parameter chunk, or an even split in whole chunks of what every DDP rank
/// holds), straight from the model's buffers.
template <class ExecSpace>
std::string save_shared(
    const Config& cfg, Model<ExecSpace>& model,
    const std::vector<std::pair<std::string, typename Model<ExecSpace>::Vec>>& state,
    const DataParallel<ExecSpace>& dp, Communicator& comm, const CheckpointContents& header,
    bool with_base) {
  const auto* shards = dp.nf4_shards();  // FSDP
  const bool fsdp = shards != nullptr;
  const int rank = comm.rank(), nranks = comm.size();

  SharedCheckpoint sc;
  sc.header = header;
  sc.header.nf4.clear();
  sc.header.nf4_shards.clear();
  sc.header.params.clear();
  sc.header.optimizer.clear();
  std::vector<std::vector<uint16_t>> bf16_keep;  // converted parts, alive until written
  std::vector<Nf4Tensor<Kokkos::HostSpace>> base_keep;
  const auto nf4_entries =
      with_base ? model.table().of_kind(ParamKind::nf4) : std::vector<const ParamEntry*>();
  base_keep.reserve(nf4_entries.size());  // parts point into it: no reallocation
  auto add_dtype_values = [&](DType dtype, const std::string& path, int64_t n, int64_t lo,
                              int64_t hi, const float* v) {
    if (dtype == DType::float32) {
      sc.parts.push_back({SharedPart::Type::f32, path, {n}, lo, hi, v});
      return;
    }
    bf16_keep.emplace_back();
    for (int64_t i = 0; i < hi - lo; ++i) bf16_keep.back().push_back(bfloat16(v[i]).bits);
    sc.parts.push_back({SharedPart::Type::bf16, path, {n}, lo, hi, bf16_keep.back().data()});
  };
  const int64_t mean_hi = rank == 0 ? 1 : 0;
  for (const ParamEntry* e : nf4_entries) {
    const std::string g = "params/" + e->name;
    Nf4Layout L;
    int64_t d0, d1, b0, b1, s0, s1;  // this rank's data bytes, blocks, scaler blocks
    const uint8_t* data;
    const int8_t* scalers;
    const float* factors;
    const float* mean;
    if (fsdp) {
      const auto h = nf4_shard_host((*shards)[e->offset]);
      Nf4Tensor<Kokkos::HostSpace> t;  // views of the shard, offset to global indices
      L = h.global;
      b0 = h.range.first_block;
      b1 = b0 + h.range.num_blocks;
      s0 = h.range.first_scaler_block;
      s1 = s0 + h.range.num_scaler_blocks;
      d0 = b0 * L.block_size / 2;
      d1 = b1 * L.block_size / 2;
      t.quantized_data = h.quantized_data;
      t.quantized_scalers = h.quantized_scalers;
      t.quantization_factor = h.quantization_factor;
      t.scaler_mean = h.scaler_mean;
      base_keep.push_back(t);
      data = t.quantized_data.data();
      scalers = t.quantized_scalers.data();
      factors = t.quantization_factor.data();
    } else {
      base_keep.push_back(nf4_host(model.nf4[e->offset]));
      const auto& t = base_keep.back();
      L = t.layout;
      // Split in whole chunks of the datasets (HDF5 then ships no chunk between ranks).
      std::tie(d0, d1) = chunk_range({L.num_bytes()}, rank, nranks);
      std::tie(b0, b1) = chunk_range({L.num_blocks()}, rank, nranks);
      std::tie(s0, s1) = chunk_range({L.num_scaler_blocks()}, rank, nranks);
      data = t.quantized_data.data() + d0;
      scalers = t.quantized_scalers.data() + b0;
      factors = t.quantization_factor.data() + s0;
    }
    mean = &base_keep.back().scaler_mean;
    sc.parts.push_back(
        {SharedPart::Type::u8, g + "/quantized_data", {L.num_bytes()}, d0, d1, data});
    sc.parts.push_back(
        {SharedPart::Type::i8, g + "/quantized_scalers", {L.num_blocks()}, b0, b1, scalers});
    add_dtype_values(L.dtype, g + "/quantization_factor", L.num_scaler_blocks(), s0, s1, factors);
    add_dtype_values(L.dtype, g + "/scaler_mean", 1, 0, mean_hi, mean);
    sc.nf4_groups.push_back({g, L});
  }
  // Frozen dense tensors (replicated): an even split in whole chunks, as DDP parameters.
  std::vector<Kokkos::View<float*, Kokkos::HostSpace>> dense_keep;
  for (const ParamEntry* e : model.table().of_kind(ParamKind::dense)) {
    if (!with_base) break;
    dense_keep.push_back(model.dense_host(*e));
    const auto [lo, hi] = chunk_range(e->shape, rank, nranks);
    sc.parts.push_back({SharedPart::Type::f32, "params/" + e->name, e->shape, lo, std::max(lo, hi),
                        dense_keep.back().data() + lo});
  }
  auto hp = host_copy(model.params);
  // Parameters: the flat chunk this rank owns (FSDP) or an even split (DDP).
  const int64_t P = model.num_params();
  std::vector<decltype(host_copy(model.params))> hs;
  for (const auto& kv : state) hs.push_back(host_copy(kv.second));
  const int64_t state_base = fsdp ? dp.chunk_offset() : 0;  // index of hs[k](0)
  for (const ParamEntry* pp : model.table().of_kind(ParamKind::trainable)) {
    const ParamEntry& p = *pp;
    // FSDP: the part of the parameter in this rank's chunk; DDP: whole dataset chunks.
    int64_t lo, hi;
    if (fsdp) {
      lo = dp.chunk_offset();
      hi = std::min(P, lo + static_cast<int64_t>(dp.chunk_params().extent(0)));
    } else {
      std::tie(lo, hi) = chunk_range(p.shape, rank, nranks);
      lo += p.offset;
      hi += p.offset;
    }
    const int64_t a = std::clamp(lo, p.offset, p.offset + p.numel());
    const int64_t b = std::clamp(hi, p.offset, p.offset + p.numel());
    sc.parts.push_back({SharedPart::Type::f32, "params/" + p.name, p.shape, a - p.offset,
                        std::max(a, b) - p.offset, hp.data() + a});
    for (size_t k = 0; k < state.size(); ++k)
      sc.parts.push_back({SharedPart::Type::f32, "optimizer/" + p.name + "/" + state[k].first,
                          p.shape, a - p.offset, std::max(a, b) - p.offset,
                          hs[k].data() + (a - state_base)});
  }
  return write_checkpoint_shared(cfg.save_dir, sc, cfg.keep_last, comm);
}

}  // namespace

CheckpointReader load_restart(const Config& cfg, std::ostream& log) {
  const std::string path = cfg.restart == "latest" ? cfg.save_dir : cfg.restart;
  if (cfg.restart == "latest") {
    struct stat st {};  // (lstat: a dangling link is reported by checkpoint_files)
    KQLORA_INPUT_CHECK(
        ::lstat((cfg.save_dir + "/latest").c_str(), &st) == 0,
        "restart = latest: " << cfg.save_dir << "/latest does not exist (no checkpoint to resume)");
  }
  CheckpointReader reader(path);
  const CheckpointContents& c = reader.contents();
  const Config old = parse_deck_text(c.config_text, path + " (config)", {}, 1, false);
  std::ostringstream diff;
  auto check = [&](const std::string& key, const std::string& a, const std::string& b) {
    if (a != b) diff << "\n  " << key << ": checkpoint " << a << ", deck " << b;
  };
  for (const auto& key : restart_fixed_keys(cfg))
    check(key, deck_value(old, key), deck_value(cfg, key));
  // A Hugging Face model: its architecture must be the one trained (the directory may move).
  // Compared as parsed specs: formatting and metadata (transformers_version) may differ.
  const ModelConfig now = model_config(cfg);
  if (now.arch_text != c.arch_text) {
    const std::string field =
        now.arch_text.empty() || c.arch_text.empty()
            ? std::string()
            : first_spec_difference(parse_decoder_config(c.arch_text, path + ": hf_config"),
                                    parse_decoder_config(now.arch_text, now.arch_source));
    if (now.arch_text.empty() || c.arch_text.empty() || !field.empty())
      diff << "\n  config.json: " << (now.arch_text.empty() ? std::string("none") : now.arch_source)
           << " differs from the checkpoint's (attribute hf_config"
           << (c.arch_text.empty() ? ": absent" : "") << ")"
           << (field.empty() ? std::string() : " in " + field + " (checkpoint vs now)");
    else
      log << "restart: " << now.arch_source
          << " differs from the checkpoint's config.json in formatting or metadata only (the "
             "same model)\n";
  }
  KQLORA_INPUT_CHECK(diff.str().empty(), "restart from " << path
                                                         << ": the deck changes what a "
                                                            "checkpoint cannot carry over:"
                                                         << diff.str());
  KQLORA_INPUT_CHECK(c.step <= cfg.num_steps,
                     "restart from " << path << ": the checkpoint is at step " << c.step
                                     << ", past num_steps " << cfg.num_steps);
  log << "restart: " << path << " at step " << c.step << "\n";
  if (c.format_version < 2) log << "warning: " << path << ": " << unchecksummed_warning << "\n";
  return reader;
}

template <class ExecSpace>
void restore_frozen(Model<ExecSpace>& model, const CheckpointReader& c) {
  using Mem = typename ExecSpace::memory_space;
  for (const ParamEntry* e : model.table().of_kind(ParamKind::nf4)) {
    const Nf4Tensor<Kokkos::HostSpace>* t = nullptr;
    for (const auto& [key, value] : c.contents().nf4)
      if (key == e->name) t = &value;
    KQLORA_INPUT_CHECK(t, "restart: NF4 tensor '" << e->name << "' missing from the checkpoint");
    model.nf4[e->offset] = nf4_copy_to<Mem>(*t);
  }
  for (const ParamEntry* e : model.table().of_kind(ParamKind::dense)) {
    Kokkos::View<float*, Mem> v(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::restart::dense"), e->numel());
    auto h = Kokkos::create_mirror_view(v);
    c.read_param(e->name, 0, e->numel(), h.data());
    Kokkos::deep_copy(v, h);  // device-wide: restart (set-up)
    model.set_dense(*e, v);
  }
}

namespace {

/// Writes into host memory: the view itself, or a mirror copied back by done(); its pages
/// placed first (their first touch, timed apart from the reading).
template <class View>
struct HostDestination {
  View view;
  typename View::HostMirror host;
  HostDestination(const View& v, double& first_touch_s)
      : view(v), host(Kokkos::create_mirror_view(v)) {
    const auto t = std::chrono::steady_clock::now();
    populate_pages(host.data(), sizeof(float) * host.extent(0));
    first_touch_s += seconds_since(t);
  }
  void done() { Kokkos::deep_copy(view, host); }  // device-wide: restart (set-up)
};

/// For each trainable parameter, the part of [first, first + n) of the flat vector it
/// covers: f(entry, lo, hi) with lo and hi indices into the parameter.
template <class F>
void for_each_part(const ParamTable& table, int64_t first, int64_t n, F&& f) {
  for (const ParamEntry* p : table.of_kind(ParamKind::trainable)) {
    const int64_t a = std::max(first, p->offset), b = std::min(first + n, p->offset + p->numel());
    if (a < b) f(*p, a - p->offset, b - p->offset);
  }
}

}  // namespace

template <class ExecSpace>
double restore_params(const Model<ExecSpace>& model, const CheckpointReader& c, int64_t first,
                      const typename Model<ExecSpace>::Vec& dst) {
  double first_touch_s = 0;
  HostDestination<typename Model<ExecSpace>::Vec> out(dst, first_touch_s);
  for_each_part(model.table(), first, dst.extent(0),
                [&](const ParamEntry& p, int64_t lo, int64_t hi) {
                  c.read_param(p.name, lo, hi, out.host.data() + (p.offset + lo - first));
                });
  out.done();
  return first_touch_s;
}

template <class ExecSpace>
double restore_optimizer(Optimizer<ExecSpace>& opt, const Model<ExecSpace>& model,
                         const CheckpointReader& c, int64_t first) {
  double first_touch_s = 0;
  for (const auto& entry : opt.state()) {
    // (named, not a structured binding: the lambda below captures it, C++20 only)
    const std::string& state = entry.first;
    const auto& view = entry.second;
    HostDestination<typename Optimizer<ExecSpace>::Vec> out(view, first_touch_s);
    const int64_t n = view.extent(0);
    // (past the last parameter: an FSDP chunk's padding, at zero as a fresh state's)
    const int64_t real = std::max<int64_t>(0, std::min(n, model.num_params() - first));
    std::fill(out.host.data() + real, out.host.data() + n, 0.0f);
    for_each_part(model.table(), first, n, [&](const ParamEntry& p, int64_t lo, int64_t hi) {
      KQLORA_INPUT_CHECK(c.has_state(p.name, state),
                         "restart: optimizer state " << state << " of '" << p.name << "' missing");
      c.read_state(p.name, state, lo, hi, out.host.data() + (p.offset + lo - first));
    });
    out.done();
  }
  opt.set_steps(c.contents().optimizer_steps);
  return first_touch_s;
}

template <class ExecSpace>
std::string save_checkpoint(
    const Config& cfg, Model<ExecSpace>& model, const Optimizer<ExecSpace>& opt,
    const std::vector<std::pair<std::string, typename Model<ExecSpace>::Vec>>& opt_state,
    const DataParallel<ExecSpace>& dp, Communicator& comm, int64_t steps_done,
    const std::string& data_source, const std::string& base_hash,
    const std::string& reference_hash) {
  const auto* shards = dp.nf4_shards();  // FSDP: the NF4 shards and this rank's chunk
  const bool with_base = base_hash.empty();
  const bool fsdp = shards != nullptr;
  const int rank = comm.rank(), nranks = comm.size();
  CheckpointContents c;
  c.step = steps_done;
  c.world_size = nranks;
  c.rank = rank;
  c.parallel = cfg.parallel;
  c.layout = cfg.checkpoint_layout;
  c.config_text = cfg.to_deck_text();
  c.model_config_text = model.config().to_text();
  c.arch_text = model.config().arch_text;
  c.table = model.table();
  c.optimizer_steps = opt.steps();
  c.seed = cfg.seed;
  c.data_source = data_source;
  c.base_hash = base_hash;
  c.reference_hash = reference_hash;
  if (cfg.checkpoint_layout == "shared")  // written straight from the model's buffers
    return save_shared(cfg, model, opt_state, dp, comm, c, with_base);
  auto hp = host_copy(model.params);
  const ParamTable& table = model.table();
  const auto trainable = table.of_kind(ParamKind::trainable);
  if (!fsdp) {
    for (const ParamEntry* e : table.of_kind(ParamKind::nf4))
      if (with_base) c.nf4.emplace_back(e->name, nf4_host(model.nf4[e->offset]));
    for (const ParamEntry* p : trainable)
      c.params.push_back(
          {p->name, p->shape,
           std::vector<float>(hp.data() + p->offset, hp.data() + p->offset + p->numel())});
    for (const auto& [state, view] : opt_state) {
      auto hs = host_copy(view);
      for (const ParamEntry* p : trainable)
        c.optimizer.push_back(
            {{p->name, state},
             std::vector<float>(hs.data() + p->offset, hs.data() + p->offset + p->numel())});
    }
  } else {
    // This rank's shards: its NF4 blocks, and the part of each parameter (and of its
    // optimizer state) that lies in its chunk of the flat vector.
    for (const ParamEntry* e : table.of_kind(ParamKind::nf4))
      if (with_base) c.nf4_shards.emplace_back(e->name, nf4_shard_host((*shards)[e->offset]));
    const int64_t lo = dp.chunk_offset(),
                  hi = lo + static_cast<int64_t>(dp.chunk_params().extent(0));
    const auto& state = opt_state;
    std::vector<decltype(host_copy(model.params))> hs;
    for (const auto& kv : state) hs.push_back(host_copy(kv.second));
    for (const ParamEntry* p : trainable) {
      const int64_t a = std::max(lo, p->offset), b = std::min(hi, p->offset + p->numel());
      if (a >= b) continue;  // not in this rank's chunk
      CheckpointTensor t{p->name, {b - a}, std::vector<float>(hp.data() + a, hp.data() + b)};
      t.first_element = a - p->offset;
      t.global_shape = p->shape;
      t.shard_index = rank;
      t.num_shards = nranks;
      c.params.push_back(std::move(t));
      for (size_t k = 0; k < state.size(); ++k)
        c.optimizer.push_back(
            {{p->name, state[k].first},
             std::vector<float>(hs[k].data() + (a - lo), hs[k].data() + (b - lo))});
    }
  }
  // Frozen dense tensors (replicated): whole in every DDP file; in rank 0's FSDP file, as
  // a slice of all of it (the other ranks' files hold none).
  for (const ParamEntry* e : table.of_kind(ParamKind::dense)) {
    if (!with_base || (fsdp && rank != 0)) continue;
    auto h = model.dense_host(*e);
    CheckpointTensor t{e->name, fsdp ? std::vector<int64_t>{e->numel()} : e->shape,
                       std::vector<float>(h.data(), h.data() + e->numel())};
    if (fsdp) {
      t.first_element = 0;
      t.global_shape = e->shape;
      t.num_shards = nranks;
    }
    c.params.push_back(std::move(t));
  }
  return write_checkpoint_per_rank(cfg.save_dir, c, cfg.keep_last, comm);
}

template <class ExecSpace>
std::string model_base_hash(const Model<ExecSpace>& model) {
  std::vector<Kokkos::View<const float*, Kokkos::HostSpace>> keep;
  std::vector<Kokkos::View<const bfloat16*, Kokkos::HostSpace>> keep16;
  return base_hash(
      model.table(), [&](const ParamEntry& e) { return nf4_host(model.nf4.at(e.offset)); },
      [&](const ParamEntry& e) {
        if (e.compact) {  // (hashed as its float32 values, without a float32 copy)
          keep16.push_back(host_copy(model.dense_bf16.at(e.offset)));
          return FloatSpan{nullptr, static_cast<int64_t>(keep16.back().extent(0)),
                           keep16.back().data()};
        }
        keep.push_back(host_copy(model.dense.at(e.offset)));
        return FloatSpan{keep.back().data(), static_cast<int64_t>(keep.back().extent(0))};
      });
}

using Exec = Kokkos::DefaultExecutionSpace;
template void restore_frozen(Model<Exec>&, const CheckpointReader&);
template std::string model_base_hash(const Model<Exec>&);

template <class ExecSpace>
std::vector<Nf4Tensor<Kokkos::HostSpace>> nf4_snapshot(const Model<ExecSpace>& model) {
  std::vector<Nf4Tensor<Kokkos::HostSpace>> v;
  for (const auto& t : model.nf4) v.push_back(nf4_host(t));
  return v;
}

template <class ExecSpace>
void check_same_base(const Model<ExecSpace>& model,
                     const std::vector<Nf4Tensor<Kokkos::HostSpace>>& before,
                     const std::string& source, const std::string& checkpoint) {
  std::vector<std::string> differ;
  auto same = [](const auto& a, const auto& b) {
    return a.extent(0) == b.extent(0) && std::equal(a.data(), a.data() + a.extent(0), b.data());
  };
  for (const ParamEntry* e : model.table().of_kind(ParamKind::nf4)) {
    const auto now = nf4_host(model.nf4[e->offset]);
    const auto& was = before.at(static_cast<size_t>(e->offset));
    if (!same(now.quantized_data, was.quantized_data) ||
        !same(now.quantized_scalers, was.quantized_scalers) ||
        !same(now.quantization_factor, was.quantization_factor) ||
        now.scaler_mean != was.scaler_mean)
      differ.push_back(e->name);
  }
  if (differ.empty()) return;
  std::ostringstream os;
  for (size_t i = 0; i < differ.size() && i < 3; ++i) os << (i ? ", " : "") << differ[i];
  if (differ.size() > 3) os << ", ... (" << differ.size() << " in all)";
  KQLORA_INPUT_CHECK(false, "restart from " << checkpoint << ": the NF4 base quantized from "
                                            << source << " differs from the checkpoint's: "
                                            << os.str() << " (the model's weights changed since?)");
}

template std::vector<Nf4Tensor<Kokkos::HostSpace>> nf4_snapshot(const Model<Exec>&);
template void check_same_base(const Model<Exec>&, const std::vector<Nf4Tensor<Kokkos::HostSpace>>&,
                              const std::string&, const std::string&);
template double restore_params(const Model<Exec>&, const CheckpointReader&, int64_t,
                               const Model<Exec>::Vec&);
template double restore_optimizer(Optimizer<Exec>&, const Model<Exec>&, const CheckpointReader&,
                                  int64_t);
template std::string save_checkpoint(const Config&, Model<Exec>&, const Optimizer<Exec>&,
                                     const std::vector<std::pair<std::string, Model<Exec>::Vec>>&,
                                     const DataParallel<Exec>&, Communicator&, int64_t,
                                     const std::string&, const std::string&, const std::string&);

}  // namespace kqlora
