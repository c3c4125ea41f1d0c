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
  if (index_.size() != entries.size()) {  // (names are never changed once added)
    index_.clear();
    for (size_t i = 0; i < entries.size(); ++i) index_.emplace(entries[i].name, i);
  }
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries[it->second];
}

const ExpertAdapter* ParamTable::expert_adapter_of(const std::string& name, int64_t* base) const {
  if (expert_indexed_ != expert_adapters.size()) {
    expert_index_.clear();
    for (size_t a = 0; a < expert_adapters.size(); ++a) {
      const ExpertAdapter& x = expert_adapters[a];
      expert_index_[x.a] = {a, -1};
      expert_index_[x.b] = {a, -1};
      for (size_t i = 0; i < x.bases.size(); ++i)
        expert_index_[x.bases[i]] = {a, static_cast<int64_t>(i)};
    }
    expert_indexed_ = expert_adapters.size();
  }
  const auto it = expert_index_.find(name);
  if (it == expert_index_.end()) return nullptr;
  if (base) *base = it->second.second;
  return &expert_adapters[it->second.first];
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
