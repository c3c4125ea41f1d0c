#include "kqlora/nn/param_table.hpp"

#include <algorithm>

#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/error.hpp"

namespace kqlora {

int64_t ParamEntry::numel() const {
  return checked_numel_of(shape, [&] { return "tensor '" + name + "'"; });
}

Nf4Layout ParamEntry::nf4_layout() const {
  KQLORA_CHECK(kind == ParamKind::nf4, "'" << name << "' is not an NF4 tensor");
  Nf4Layout L;
  L.shape = shape;
  L.dtype = dtype;
  L.block_size = block_size;
  L.scaler_block_size = scaler_block_size;
  return L;
}

ParamEntry& ParamTable::add(ParamEntry e, const std::string& group) {
  KQLORA_CHECK(!find(e.name), "parameter table: '" << e.name << "' added twice");
  const auto g = std::find(groups.begin(), groups.end(), group);
  e.group = static_cast<int>(g - groups.begin());
  if (g == groups.end()) groups.push_back(group);
  if (e.kind == ParamKind::trainable) {
    e.offset = num_trainable;
    num_trainable = checked_add(num_trainable, e.numel(), "the model's trainable parameters");
  } else {
    e.offset = count(e.kind);
  }
  entries.push_back(std::move(e));
  return entries.back();
}

const ParamEntry* ParamTable::find(const std::string& name) const {
  for (const auto& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

const ParamEntry& ParamTable::at(const std::string& name) const {
  const ParamEntry* e = find(name);
  KQLORA_CHECK(e, "no parameter named '" << name << "'");
  return *e;
}

std::vector<const ParamEntry*> ParamTable::of_kind(ParamKind k) const {
  std::vector<const ParamEntry*> v;
  for (const auto& e : entries)
    if (e.kind == k) v.push_back(&e);
  return v;
}

int64_t ParamTable::count(ParamKind k) const {
  return static_cast<int64_t>(std::count_if(entries.begin(), entries.end(),
                                            [&](const ParamEntry& e) { return e.kind == k; }));
}

std::pair<int64_t, int64_t> ParamTable::trainable_range(int group) const {
  int64_t lo = INT64_MAX, hi = 0, n = 0;
  for (const auto& e : entries) {
    if (e.group != group || e.kind != ParamKind::trainable) continue;
    lo = std::min(lo, e.offset);
    hi = std::max(hi, e.offset + e.numel());
    n += e.numel();
  }
  if (n == 0) return {0, 0};
  KQLORA_CHECK(hi - lo == n, "parameter table: group '"
                                 << groups.at(group) << "' is not contiguous in the flat buffer");
  return {lo, hi};
}

std::vector<int> ParamTable::nf4_of_group(int group) const {
  std::vector<int> v;
  for (const auto& e : entries)
    if (e.group == group && e.kind == ParamKind::nf4) v.push_back(static_cast<int>(e.offset));
  return v;
}

}  // namespace kqlora
