#include "kqlora/io/checkpoint_diff.hpp"

#include "kqlora/io/base_hash.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

namespace kqlora {

namespace {

DiffLine compare_floats(const std::string& name, const std::vector<int64_t>& ref_shape,
                        const std::vector<float>& r, const std::vector<int64_t>& test_shape,
                        const std::vector<float>& t, const DiffOptions& o) {
  DiffLine line{name, "float"};
  if (ref_shape != test_shape || r.size() != t.size()) {
    line.kind = "shape";
    line.equal = false;
    line.detail = "shapes differ";
    return line;
  }
  for (size_t i = 0; i < r.size(); ++i) {
    const double a = r[i], b = t[i];
    if (std::isnan(a) || std::isnan(b)) {
      if (!(o.equal_nan && std::isnan(a) && std::isnan(b))) {
        line.equal = false;
        line.detail = "NaN at element " + std::to_string(i);
      }
      continue;
    }
    const double d = std::fabs(b - a);
    if (!(d <= o.atol + o.rtol * std::fabs(a))) line.equal = false;  // Inf - Inf fails too
    line.max_abs = std::max(line.max_abs, d);
    if (a != 0) line.max_rel = std::max(line.max_rel, d / std::fabs(a));
  }
  return line;
}

template <class V>
bool same_bytes(const V& a, const V& b) {
  return a.extent(0) == b.extent(0) &&
         std::memcmp(a.data(), b.data(), a.extent(0) * sizeof(typename V::value_type)) == 0;
}

DiffLine compare_nf4(const std::string& name, const h5::HostNf4& r, const h5::HostNf4& t) {
  DiffLine line{name, "nf4"};
  std::ostringstream why;
  if (r.layout != t.layout) {
    why << "layout " << r.layout.shape_string() << " vs " << t.layout.shape_string();
  } else {
    if (!same_bytes(r.quantized_data, t.quantized_data)) why << " quantized_data";
    if (!same_bytes(r.quantized_scalers, t.quantized_scalers)) why << " quantized_scalers";
    if (!same_bytes(r.quantization_factor, t.quantization_factor)) why << " quantization_factor";
    if (std::memcmp(&r.scaler_mean, &t.scaler_mean, sizeof(float)) != 0) why << " scaler_mean";
  }
  line.detail = why.str();
  line.equal = line.detail.empty();
  if (!line.equal) line.detail = "differs:" + line.detail;
  if (r.layout == t.layout) {  // and how far apart the values are
    const int64_t n = r.layout.numel();
    Kokkos::View<float*, Kokkos::HostSpace> a("kqlora::diff::ref", n), b("kqlora::diff::test", n);
    nf4_dequantize(Kokkos::DefaultHostExecutionSpace(), r, a);
    nf4_dequantize(Kokkos::DefaultHostExecutionSpace(), t, b);
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::fabs(static_cast<double>(b(i)) - a(i));
      line.max_abs = std::max(line.max_abs, d);
      if (a(i) != 0) line.max_rel = std::max(line.max_rel, d / std::fabs(a(i)));
    }
  }
  return line;
}

}  // namespace

std::vector<DiffLine> diff_checkpoints(const CheckpointContents& ref,
                                       const CheckpointContents& test, const DiffOptions& o) {
  std::vector<DiffLine> out;
  std::map<std::string, const h5::HostNf4*> test_nf4;
  std::map<std::string, const CheckpointTensor*> test_float;
  // A checkpoint that stores its base's identity (checkpoint_base = auto): the bases are
  // compared by that hash (of the stored tensors, for a file that has them), the other
  // tensors one by one.
  const bool by_hash = !ref.base_hash.empty() || !test.base_hash.empty();
  auto frozen = [&](const std::string& name) {
    const ParamEntry* e = ref.table.find(name);
    return by_hash && e && e->kind != ParamKind::trainable;
  };
  if (by_hash) {
    const std::string a = ref.base_hash.empty() ? base_hash(ref, "REF") : ref.base_hash;
    const std::string b = test.base_hash.empty() ? base_hash(test, "TEST") : test.base_hash;
    out.push_back({"base (hash of the NF4 and frozen tensors)", "nf4", a == b, 0, 0,
                   a == b ? "" : a + " vs " + b});
  }
  for (const auto& [n, t] : test.nf4)
    if (!frozen(n)) test_nf4[n] = &t;
  for (const auto& p : test.params)
    if (!frozen(p.name)) test_float[p.name] = &p;
  for (const auto& [n, r] : ref.nf4) {
    if (frozen(n)) continue;
    const auto it = test_nf4.find(n);
    if (it == test_nf4.end()) {
      out.push_back({n, "missing", false, 0, 0, "NF4 parameter missing from the test"});
      continue;
    }
    out.push_back(compare_nf4(n, r, *it->second));
    test_nf4.erase(it);
  }
  for (const auto& p : ref.params) {
    if (frozen(p.name)) continue;
    const auto it = test_float.find(p.name);
    if (it == test_float.end()) {
      out.push_back({p.name, "missing", false, 0, 0, "parameter missing from the test"});
      continue;
    }
    out.push_back(compare_floats(p.name, p.shape, p.data, it->second->shape, it->second->data, o));
    test_float.erase(it);
  }
  for (const auto& kv : test_nf4)
    out.push_back({kv.first, "extra", false, 0, 0, "only in the test"});
  for (const auto& kv : test_float)
    out.push_back({kv.first, "extra", false, 0, 0, "only in the test"});
  if (o.optimizer) {
    std::map<std::pair<std::string, std::string>, const std::vector<float>*> t_state;
    for (const auto& [key, v] : test.optimizer) t_state[key] = &v;
    for (const auto& [key, v] : ref.optimizer) {
      const std::string name = "optimizer/" + key.first + "/" + key.second;
      const auto it = t_state.find(key);
      if (it == t_state.end()) {
        out.push_back({name, "missing", false, 0, 0, "optimizer state missing from the test"});
        continue;
      }
      const std::vector<int64_t> shape{static_cast<int64_t>(v.size())};
      const std::vector<int64_t> tshape{static_cast<int64_t>(it->second->size())};
      out.push_back(compare_floats(name, shape, v, tshape, *it->second, o));
      t_state.erase(it);
    }
    for (const auto& kv : t_state)
      out.push_back({"optimizer/" + kv.first.first + "/" + kv.first.second, "extra", false, 0, 0,
                     "only in the test"});
    if (ref.optimizer_steps != test.optimizer_steps)
      out.push_back(
          {"optimizer/step", "float", false, 0, 0,
           std::to_string(ref.optimizer_steps) + " vs " + std::to_string(test.optimizer_steps)});
  }
  return out;
}

}  // namespace kqlora
