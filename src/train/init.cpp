#include "kqlora/train/init.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <utility>

#include <sys/stat.h>

#include "kqlora/build_config.hpp"
#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/json.hpp"
#include "kqlora/core/non_finite.hpp"
#include "kqlora/core/random.hpp"
#include "kqlora/io/peft_adapter.hpp"
#include "kqlora/io/tensor_source.hpp"
#include "kqlora/quant/mxfp4.hpp"
#include "kqlora/quant/nf4_kernels.hpp"
#include "kqlora/train/synthetic.hpp"
#if KQLORA_HAVE_HDF5
#include "kqlora/io/hdf5_params.hpp"
#endif

namespace kqlora {

namespace {

// Kaiming-uniform with a = sqrt(5): bound 1/sqrt(fan_in).
std::vector<float> uniform(uint64_t seed, uint64_t stream, int64_t n, double bound) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((2.0 * random_uniform(seed, stream, static_cast<uint64_t>(i)) - 1.0) *
                              bound);
  return v;
}

/// A float tensor from the init file, by name, if it has one.
struct InitFile {
  std::string path;
  std::unique_ptr<TensorSource> source;  // safetensors
#if KQLORA_HAVE_HDF5
  h5::Handle file, params;  // HDF5
#endif
  std::set<std::string> names, used;
  std::map<std::string, std::string> stored;  // kqlora name -> the file's (PEFT directories)
  std::map<std::string, const ExpertAdapter*> peft_expert_b;  // B in PEFT's layout

  explicit InitFile(const std::string& p, const ModelConfig* cfg = nullptr) : path(p) {
    if (p.empty()) return;
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      open_peft_directory(cfg);
      return;
    }
    char sig[8] = {0};
    std::ifstream(p, std::ios::binary).read(sig, 8);
    if (std::string(sig, 4) == "\x89HDF") {
#if KQLORA_HAVE_HDF5
      h5::InputFileScope scope(p);
      file = h5::open_file(p);
      KQLORA_INPUT_CHECK(h5::exists(file, "params"),
                         p << ": init_file has no /params group (checkpoint schema)");
      params = h5::open_group(file, "params");
      for (const auto& d : h5::list_datasets(params)) {
        const auto slash = d.find('/');
        names.insert(slash == std::string::npos ? d : d.substr(0, slash));
      }
#endif
    } else {
      source = open_tensor_source(p);
      for (const auto& e : source->entries()) names.insert(e.name);
    }
  }

  /// A PEFT adapter directory (adapter_config.json, adapter_model.safetensors): its
  /// LoRA configuration must be the deck's; base_model.model.<module>.lora_A.weight is
  /// <module>.lora_a.weight (lora_B: lora_b), base_model.model.<name> is <name>.
  void open_peft_directory(const ModelConfig* cfg) {
    const std::string config = path + "/adapter_config.json";
    std::ifstream f(config);
    KQLORA_INPUT_CHECK(f.good(), path << ": a directory, but not a PEFT adapter directory ("
                                      << config << " cannot be read)");
    std::stringstream text;
    text << f.rdbuf();
    const json::Value doc = json::parse(text.str(), config);
    auto field = [&](const char* key) {
      const json::Value* v = doc.kind == json::Value::Kind::object ? doc.find(key) : nullptr;
      return v;
    };
    const json::Value* type = field("peft_type");
    KQLORA_INPUT_CHECK(type && type->kind == json::Value::Kind::string && type->string == "LORA",
                       config << ": peft_type is not \"LORA\"");
    for (const char* key : {"use_rslora", "use_dora", "fan_in_fan_out"}) {
      const json::Value* v = field(key);
      KQLORA_INPUT_CHECK(!v || v->kind != json::Value::Kind::boolean || !v->boolean,
                         config << ": " << key << " = true is not supported (kqlora's adapters "
                                << "are plain LoRA, scale lora_alpha / r, weights [out, in])");
    }
    if (cfg) {
      const json::Value* r = field("r");
      const json::Value* alpha = field("lora_alpha");
      KQLORA_INPUT_CHECK(
          r && r->kind == json::Value::Kind::number && r->number == cfg->rank,
          config << ": r " << (r ? r->number : -1) << " differs from lora_rank " << cfg->rank);
      KQLORA_INPUT_CHECK(
          alpha && alpha->kind == json::Value::Kind::number && alpha->number == cfg->alpha,
          config << ": lora_alpha " << (alpha ? alpha->number : -1) << " differs from lora_alpha "
                 << cfg->alpha << " (the adapters would be scaled differently)");
    }
    const std::string weights = path + "/adapter_model.safetensors";
    source = open_tensor_source(weights);
    for (const auto& e : source->entries()) {
      const std::string name = peft::kqlora_name(e.name, weights);
      stored[name] = e.name;
      names.insert(name);
    }
    path = weights;
  }

  /// A multimodal model file's language model under the table's names: `file_prefix`X is
  /// read as model.X (the other tensors keep their names: lm_head.weight, a vision tower).
  void map_file_prefix(const std::string& file_prefix) {
    if (file_prefix.empty() || !source) return;
    std::vector<std::string> moved;
    for (const auto& n : names)
      if (n.rfind(file_prefix, 0) == 0) moved.push_back(n);
    for (const auto& n : moved) {  // (a PEFT file's names are mapped already: its own kept)
      const std::string mine = "model." + n.substr(file_prefix.size());
      names.erase(n);
      names.insert(mine);
      const auto it = stored.find(n);
      stored[mine] = it == stored.end() ? n : it->second;
      if (it != stored.end()) stored.erase(n);
    }
  }

  /// A PEFT directory's expert adapters (target_parameters) under the table's names: A as
  /// stored, B from PEFT's [out, r * E] layout (docs/MODELS.md, "Experts").
  void map_expert_adapters(const ParamTable& t) {
    if (stored.empty()) return;  // (not a PEFT directory)
    for (const ExpertAdapter& a : t.expert_adapters)
      for (bool b : {false, true}) {
        const std::string key = peft::expert_adapter_key(a, b);
        const std::string as_read = peft::kqlora_name(key, path);
        if (!names.count(as_read)) continue;
        // (the file's own key: a multimodal model's under its prefix, map_file_prefix)
        const auto it = stored.find(as_read);
        const std::string file_key = it != stored.end() ? it->second : key;
        names.erase(as_read);
        stored.erase(as_read);
        const std::string& mine = b ? a.b : a.a;
        names.insert(mine);
        stored[mine] = file_key;
        if (b) peft_expert_b[mine] = &a;
      }
  }

  std::string stored_name(const std::string& name) const {
    const auto it = stored.find(name);
    return it == stored.end() ? name : it->second;
  }

  bool has(const std::string& name) const {
    return names.count(name) > 0;
  }

  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape) {
    used.insert(name);
    const std::string where = path + ": tensor '" + name + "'";
    std::vector<float> out;
    std::vector<int64_t> got;
#if KQLORA_HAVE_HDF5
    if (params.get() >= 0 && !source) {
      h5::InputFileScope scope(path);
      KQLORA_INPUT_CHECK(!h5::is_nf4_group(params, name), where << " is NF4; expected floats");
      got = h5::dataset_dims(params, name, path);
      int64_t n = 1;
      for (int64_t d : got) n *= d;
      KQLORA_INPUT_CHECK(got == shape, where << " has shape " << shape_text(got) << ", expected "
                                             << shape_text(shape));
      out.resize(static_cast<size_t>(n));
      h5::read_dataset(params, name, H5T_NATIVE_FLOAT, n, out.data(), path);
      refuse_non_finite(out.data(), n, 0, shape, where);
      return out;
    }
#endif
    HostTensor t = source->load(stored_name(name));
    const auto peft_b = peft_expert_b.find(name);
    const std::vector<int64_t> want =
        peft_b == peft_expert_b.end() ? shape : peft::peft_expert_b_shape(*peft_b->second);
    KQLORA_INPUT_CHECK(t.shape == want, path << ": tensor '" << stored_name(name) << "' has shape "
                                             << shape_text(t.shape) << ", expected "
                                             << shape_text(want));
    if (t.is_bf16)
      for (const auto& b : t.bf16) out.push_back(static_cast<float>(b));
    else
      out = std::move(t.f32);
    if (peft_b != peft_expert_b.end()) out = peft::convert_expert_b(*peft_b->second, out, false);
    refuse_non_finite(out.data(), static_cast<int64_t>(out.size()), 0, shape,
                      path + ": tensor '" + stored_name(name) + "'");
    return out;
  }

  /// floats() into dst [numel of shape], streamed from a model file (set-up then holds no
  /// second copy of a large tensor, docs/TRAINING.md "The memory check").
  void floats_into(const std::string& name, const std::vector<int64_t>& shape, float* dst) {
    if (!source) {
      const auto v = floats(name, shape);
      std::copy(v.begin(), v.end(), dst);
      return;
    }
    source->load_f32(stored_of_shape(name, shape), dst);
  }

  /// The stored name of a tensor of the safetensors source, checked to have `shape`
  /// (and marked read).
  std::string stored_of_shape(const std::string& name, const std::vector<int64_t>& shape) {
    used.insert(name);
    const std::string stored = stored_name(name);
    std::vector<int64_t> got;
    for (const auto& e : source->entries())
      if (e.name == stored) got = e.shape;
    KQLORA_INPUT_CHECK(got == shape, path + ": tensor '" + name + "'"
                                         << " has shape " << shape_text(got) << ", expected "
                                         << shape_text(shape));
    return stored;
  }

  /// `count` values from element `first` of a tensor (row-major) of a safetensors source,
  /// widened to float32 (the shape checked as floats_into does).
  void floats_range_into(const std::string& name, const std::vector<int64_t>& shape, int64_t first,
                         int64_t count, float* dst) {
    KQLORA_CHECK(source, "floats_range_into: " << path << " is not a safetensors source");
    source->load_f32_range(stored_of_shape(name, shape), first, count, dst);
  }

  /// The tensors of an alternative place (MXFP4: its blocks and scales).
  static std::vector<std::string> tensors_of(const TensorSlice& a) {
    if (!a.mxfp4) return {a.tensor};
    return {a.tensor + "_blocks", a.tensor + "_scales"};
  }

  /// The alternative place of e this file holds (null: none); InputError when it holds two
  /// (the experts in two layouts).
  const TensorSlice* alt_of(const ParamEntry& e) const {
    const TensorSlice* found = nullptr;
    for (const TensorSlice& a : e.alts) {
      if (!has(tensors_of(a).front())) continue;
      KQLORA_INPUT_CHECK(!found, path << ": both '" << tensors_of(*found).front() << "' and '"
                                      << tensors_of(a).front()
                                      << "' are there: one tensor in two layouts; keep one");
      found = &a;
    }
    return found;
  }

  /// Entry e's values from its alternative place `a` (ParamEntry::alts) into dst.
  void slice_into(const ParamEntry& e, const TensorSlice& a, float* dst) {
    for (const auto& n : tensors_of(a)) used.insert(n);
    KQLORA_INPUT_CHECK(source, path << ": tensor '" << a.tensor
                                    << "': a fused tensor in an HDF5 init_file is not read");
    const auto shape_of = [&](const std::string& name) {
      for (const auto& x : source->entries())
        if (x.name == stored_name(name)) return x.shape;
      return std::vector<int64_t>();
    };
    const int64_t rows = e.shape.size() == 2 ? e.shape[0] : 1, cols = e.shape.back();
    const int64_t row_stride = a.row_stride ? a.row_stride : cols;
    const int64_t lo = a.first,
                  hi = a.first + (rows - 1) * row_stride + (cols - 1) * a.col_stride + 1;
    std::vector<float> span;
    int64_t base = lo;  // (the element span[0] is)
    if (!a.mxfp4) {
      const auto got = shape_of(a.tensor);
      KQLORA_INPUT_CHECK(got == a.shape, path + ": tensor '" + a.tensor + "'"
                                             << " has shape " << shape_text(got) << ", expected "
                                             << shape_text(a.shape));
      span.resize(static_cast<size_t>(hi - lo));
      source->load_f32_range(stored_name(a.tensor), lo, hi - lo, span.data());
    } else {
      // MXFP4: the source rows the span covers, decoded (quant/mxfp4.hpp).
      const int64_t C = a.shape.back();
      std::vector<int64_t> blocks_shape(a.shape.begin(), a.shape.end() - 1), scales_shape;
      blocks_shape.push_back(C / 32);
      scales_shape = blocks_shape;
      blocks_shape.push_back(16);
      const std::string blocks = a.tensor + "_blocks", scales = a.tensor + "_scales";
      KQLORA_INPUT_CHECK(C % 32 == 0 && shape_of(blocks) == blocks_shape,
                         path << ": tensor '" << blocks << "' has shape "
                              << shape_text(shape_of(blocks)) << ", expected "
                              << shape_text(blocks_shape) << " (MXFP4 of " << shape_text(a.shape)
                              << ")");
      KQLORA_INPUT_CHECK(shape_of(scales) == scales_shape,
                         path << ": tensor '" << scales << "' has shape "
                              << shape_text(shape_of(scales)) << ", expected "
                              << shape_text(scales_shape) << " (MXFP4 of " << shape_text(a.shape)
                              << ")");
      const int64_t r0 = lo / C, r1 = (hi - 1) / C + 1;
      std::vector<uint8_t> b(static_cast<size_t>((r1 - r0) * C / 2)),
          sc(static_cast<size_t>((r1 - r0) * C / 32));
      source->load_u8_range(stored_name(blocks), r0 * C / 2, static_cast<int64_t>(b.size()),
                            b.data());
      source->load_u8_range(stored_name(scales), r0 * C / 32, static_cast<int64_t>(sc.size()),
                            sc.data());
      span.resize(static_cast<size_t>((r1 - r0) * C));
      mxfp4_decode(b.data(), sc.data(), r1 - r0, C, span.data(),
                   path + ": tensor '" + a.tensor + "' (rows " + std::to_string(r0) + " on)");
      base = r0 * C;
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        dst[r * cols + c] =
            span[static_cast<size_t>(a.first - base + r * row_stride + c * a.col_stride)];
  }

  static std::string shape_text(const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  }
};

}  // namespace

std::vector<float> seed_values(const ModelConfig& cfg, const ParamEntry& p) {
  const InitRule& r = p.init;
  KQLORA_CHECK(r.dist != InitRule::Dist::normal,
               "'" << p.name << "': normal values are generated in place (fill_normal)");
  if (r.dist == InitRule::Dist::zeros)
    return std::vector<float>(static_cast<size_t>(p.numel()), 0.0f);
  return uniform(cfg.seed, r.stream, p.numel(), 1.0 / std::sqrt(static_cast<double>(r.fan_in)));
}

std::string hf_weights_file(const std::string& dir, bool optional) {
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"}) {
    const std::string path = dir + "/" + name;
    if (std::ifstream(path).good()) return path;
  }
  KQLORA_INPUT_CHECK(optional, "hf_model_dir " << dir
                                               << ": has neither model.safetensors nor "
                                                  "model.safetensors.index.json");
  return "";
}

std::vector<float> starting_trainables(const ModelConfig& cfg, const ParamTable& table,
                                       const std::string& init_file) {
  InitFile init(init_file, &cfg);
  init.map_file_prefix(table.file_prefix);
  init.map_expert_adapters(table);
  std::vector<float> out(static_cast<size_t>(table.num_trainable));
  for (const ParamEntry* p : table.of_kind(ParamKind::trainable)) {
    const std::vector<float> v =
        init.has(p->name) ? init.floats(p->name, p->shape) : seed_values(cfg, *p);
    std::copy(v.begin(), v.end(), out.begin() + p->offset);
  }
  return out;
}

template <class ExecSpace>
void initialize_model(const ExecSpace& exec, Model<ExecSpace>& model, const std::string& init_file,
                      std::ostream& log) {
  using Mem = typename ExecSpace::memory_space;
  const ModelConfig& cfg = model.config();
  // Highest precedence first: the init_file, the model's own files, the seed.
  InitFile init(init_file, &cfg);
  // (a PEFT directory saved from the multimodal model a user loads, Gemma 4's: its
  // adapters under the text decoder's prefix there)
  init.map_file_prefix(model.table().file_prefix);
  init.map_expert_adapters(model.table());
  // (a directory of config.json alone when the init_file holds every base tensor: an NF4
  // base made shard by shard, docs/TRAINING.md "A base larger than the disk")
  const std::string weights = cfg.hf_model_dir.empty()
                                  ? std::string()
                                  : hf_weights_file(cfg.hf_model_dir, !init_file.empty());
  if (!cfg.hf_model_dir.empty() && weights.empty())
    log << "init: hf_model_dir " << cfg.hf_model_dir
        << " has no weights file: every base tensor from the init_file\n";
  InitFile base(weights);
  base.map_file_prefix(model.table().file_prefix);
  int from_file = 0, from_base = 0, from_seed = 0;
  // (an entry read from its alternative place: a fused expert parameter of the base's)
  auto sliced = [&](const ParamEntry& e) {
    const TensorSlice* a = base.alt_of(e);
    if (!a) return false;
    KQLORA_INPUT_CHECK(!base.has(e.name),
                       base.path << ": both '" << e.name << "' and '" << a->tensor
                                 << "' are there: the experts in two layouts (the hub's "
                                    "per-expert tensors and a fused one); keep one");
    return !init.has(e.name);
  };
  // The base's tensors of an entry the init_file gives (overridden: read, in a sense).
  auto overridden = [&](const ParamEntry& e) {
    if (base.has(e.name)) base.used.insert(e.name);
    if (const TensorSlice* a = base.alt_of(e))
      for (const auto& n : InitFile::tensors_of(*a)) base.used.insert(n);
  };
  auto file_of = [&](const ParamEntry& e) -> InitFile* {
    if (init.has(e.name)) {
      overridden(e);
      return &init;
    }
    if (base.has(e.name) || sliced(e)) return &base;
    KQLORA_INPUT_CHECK(
        e.init.dist != InitRule::Dist::file,
        "tensor '" << e.name << "' is in none of "
                   << (base.path.empty() ? std::string("the model's files") : base.path)
                   << (init_file.empty() ? "" : " and " + init_file));
    return nullptr;
  };
  auto count = [&](const InitFile* f) { ++(f == &init ? from_file : f ? from_base : from_seed); };
  // The float32 values of a frozen tensor into w32: from a file, or N(0, 1) generated in
  // place.
  auto frozen_values_into = [&](const ParamEntry& e, const Kokkos::View<float*, Mem>& w32) {
    InitFile* f = file_of(e);
    if (f == &base && sliced(e)) {
      std::vector<float> w(static_cast<size_t>(e.numel()));
      base.slice_into(e, *base.alt_of(e), w.data());
      // device-wide: set-up
      Kokkos::deep_copy(w32, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                 w.data(), w.size()));
    } else if (f && std::is_same<Mem, Kokkos::HostSpace>::value) {
      f->floats_into(e.name, e.shape, w32.data());
    } else if (f) {
      const auto w = f->floats(e.name, e.shape);
      // device-wide: set-up
      Kokkos::deep_copy(w32, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                 w.data(), w.size()));
    } else if (e.init.dist == InitRule::Dist::normal) {
      fill_normal(exec, w32, cfg.seed, e.init.stream);
    } else {
      // device-wide: set-up
      Kokkos::deep_copy(w32, 0.0f);
    }
    count(f);
  };
  // The NF4 weights pass through one float32 (and bfloat16) staging buffer of the largest's
  // size: a buffer per weight was the 7B shape's set-up mostly in the kernel, faulting in
  // and zeroing 27 GB of fresh pages per rank (docs/BENCHMARKS.md).
  int64_t largest = 0;
  for (const ParamEntry* ep : model.table().of_kind(ParamKind::nf4))
    largest = std::max(largest, ep->numel());
  Kokkos::View<float*, Mem> w32_staging;
  Kokkos::View<bfloat16*, Mem> w16_staging;

  for (const ParamEntry* ep : model.table().of_kind(ParamKind::nf4)) {
    const ParamEntry& e = *ep;
    const Nf4Layout layout = e.nf4_layout();
#if KQLORA_HAVE_HDF5
    h5::InputFileScope scope(init_file);
    if (init.has(e.name) && !init.source && h5::is_nf4_group(init.params, e.name)) {
      init.used.insert(e.name);
      overridden(e);
      auto t = h5::read_nf4(init.params, e.name, init_file);
      KQLORA_INPUT_CHECK(
          t.layout == layout,
          init_file << ": NF4 tensor '" << e.name << "' is " << t.layout.shape_string() << " "
                    << dtype_name(t.layout.dtype) << " with blocks " << t.layout.block_size << "/"
                    << t.layout.scaler_block_size << "; the deck asks for " << layout.shape_string()
                    << " " << dtype_name(layout.dtype) << " with blocks " << layout.block_size
                    << "/" << layout.scaler_block_size);
      model.nf4[e.offset] = nf4_copy_to<Mem>(t);
      ++from_file;
      continue;
    }
#endif
    // The float32 weight, then NF4 in the dtype.
    if (w32_staging.extent(0) == 0)
      w32_staging = Kokkos::View<float*, Mem>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kqlora::init::w")), largest);
    const auto w32 = Kokkos::subview(w32_staging, std::make_pair(int64_t(0), e.numel()));
    frozen_values_into(e, w32);
    if (layout.dtype == DType::bfloat16) {
      if (w16_staging.extent(0) == 0)
        w16_staging = Kokkos::View<bfloat16*, Mem>(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kqlora::init::w_bf16")),
            largest);
      const auto w16 = Kokkos::subview(w16_staging, std::make_pair(int64_t(0), layout.numel()));
      Kokkos::parallel_for(
          "kqlora::init::to_bf16",
          Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, layout.numel()),
          KOKKOS_LAMBDA(int64_t i) { w16(i) = bfloat16(w32(i)); });
      model.nf4[e.offset] =
          nf4_quantize<bfloat16>(exec, Kokkos::View<const bfloat16*, Mem>(w16), layout, e.name);
    } else {
      model.nf4[e.offset] =
          nf4_quantize<float>(exec, Kokkos::View<const float*, Mem>(w32), layout, e.name);
    }
  }
  w32_staging = Kokkos::View<float*, Mem>();  // (gone before the dense tensors come)
  w16_staging = Kokkos::View<bfloat16*, Mem>();
  // A compact (bfloat16) dense tensor, a slab at a time: never whole in float32 (a real
  // Gemma 4 E2B's per-layer table is 4.7 GB so, 9.4 GB as float32). In a float32 run its
  // values must be bfloat16 values already (its config.json's dtype said so).
  auto load_compact = [&](const ParamEntry& e) {
    InitFile* f = file_of(e);
    KQLORA_CHECK(f, "compact tensor '" << e.name << "' comes from no file");
    const int64_t n = e.numel(), slab = std::min<int64_t>(n, int64_t(1) << 22);
    Kokkos::View<bfloat16*, Mem> b(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kqlora::init::dense_bf16")),
        n);
    std::vector<float> whole;  // (an HDF5 init_file: read whole)
    if (!f->source) whole = f->floats(e.name, e.shape);
    std::vector<float> w(static_cast<size_t>(f->source ? slab : 0));
    std::vector<bfloat16> h(static_cast<size_t>(slab));
    const bool rounded = model.config().bf16();  // (a bfloat16 run rounds every dense value)
    for (int64_t first = 0; first < n; first += slab) {
      const int64_t c = std::min(slab, n - first);
      const float* v = whole.empty() ? w.data() : whole.data() + first;
      if (whole.empty()) f->floats_range_into(e.name, e.shape, first, c, w.data());
      for (int64_t i = 0; i < c; ++i) {
        h[static_cast<size_t>(i)] = bfloat16(v[i]);
        KQLORA_INPUT_CHECK(
            rounded || static_cast<float>(h[static_cast<size_t>(i)]) == v[i],
            f->path << ": tensor '" << e.name << "' element " << first + i << " is " << v[i]
                    << ", not a bfloat16 value, while config.json's dtype is bfloat16 (kqlora "
                    << "holds this table in bfloat16; docs/MODELS.md, \"Gemma 4\"): store the "
                    << "table in bfloat16, or set config.json's dtype to float32");
      }
      // device-wide: set-up
      Kokkos::deep_copy(Kokkos::subview(b, std::make_pair(first, first + c)),
                        Kokkos::View<const bfloat16*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                            h.data(), static_cast<size_t>(c)));
    }
    model.dense_bf16[e.offset] = b;
    count(f);
  };
  for (const ParamEntry* ep : model.table().of_kind(ParamKind::dense)) {
    if (ep->compact) {
      load_compact(*ep);
      continue;
    }
    Kokkos::View<float*, Mem> w(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kqlora::init::w")),
        ep->numel());
    frozen_values_into(*ep, w);
    if (ep->dtype == DType::bfloat16)  // the values of its dtype, held as float32
      Kokkos::parallel_for(
          "kqlora::init::round_bf16",
          Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, w.extent(0)),
          KOKKOS_LAMBDA(int64_t i) { w(i) = round_to_bf16(w(i)); });
    model.dense[ep->offset] = w;
  }

  auto host = Kokkos::create_mirror_view(model.params);
  for (const ParamEntry* p : model.table().of_kind(ParamKind::trainable)) {
    InitFile* f = file_of(*p);
    const std::vector<float> v = f ? f->floats(p->name, p->shape) : seed_values(cfg, *p);
    count(f);
    std::copy(v.begin(), v.end(), host.data() + p->offset);
  }
  // device-wide: set-up
  Kokkos::deep_copy(model.params, host);
  model.params_changed();

  auto unused_of = [](const InitFile& f) {
    std::vector<std::string> unused;
    for (const auto& n : f.names)
      if (!f.used.count(n)) unused.push_back(n);
    return unused;
  };
  if (!base.path.empty()) {
    log << "init: " << from_base << " tensors from " << base.path << "\n";
    auto unused = unused_of(base);
    // (what the config says is not read -- a vision tower -- reported once a prefix)
    for (const auto& skip : model.table().skipped_prefixes) {
      // (named, not a structured binding: a lambda captures it, C++20 for those)
      const std::string &prefix = skip.first, &why = skip.second;
      const auto skipped = std::stable_partition(
          unused.begin(), unused.end(), [&](const auto& n) { return n.rfind(prefix, 0) == 0; });
      const auto count = skipped - unused.begin();
      if (count > 0)
        log << "init: " << count << " tensors of " << base.path << " under '" << prefix
            << "' are not read: " << why << "\n";
      unused.erase(unused.begin(), skipped);
    }
    for (const auto& n : unused)  // (a tensor of the table may come from the init_file)
      for (const auto& prefix :
           model.table().find(n) ? std::vector<std::string>() : model.table().owned_prefixes)
        KQLORA_INPUT_CHECK(n.rfind(prefix, 0) != 0,
                           base.path << ": tensor '" << n
                                     << "' is not one the config.json describes (an expert "
                                        "beyond num_experts, or another layout of them: the "
                                        "hub's per-expert tensors are read; docs/MODELS.md)");
    // A tied model whose file still holds lm_head.weight: transformers ignores it too.
    if (!unused.empty())
      log << "init: note: " << unused.size() << " tensors of " << base.path << " are not read ("
          << unused.front()
          << (unused.front() == "lm_head.weight" ? ": the head is tied to the embedding" : "")
          << (unused.size() > 1 ? ", ..." : "") << ")\n";
  }
  if (!init_file.empty()) {
    log << "init: " << from_file << " tensors from " << init_file << ", " << from_seed
        << " from seed " << cfg.seed << "\n";
    const auto unused = unused_of(init);
    if (!unused.empty()) {
      log << "init: note: " << unused.size() << " tensors of " << init_file
          << " are not model parameters and were ignored (first: " << unused.front() << ")\n";
    }
  } else {
    log << "init: " << (base.path.empty() ? "all " : "") << from_seed << " tensors from seed "
        << cfg.seed << "\n";
  }
}

template void initialize_model(const Kokkos::DefaultExecutionSpace&,
                               Model<Kokkos::DefaultExecutionSpace>&, const std::string&,
                               std::ostream&);

}  // namespace kqlora
