#include "bench_llama.hpp"

#include <atomic>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <random>
#include <sstream>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/gemm_calls.hpp"
#include "kqlora/nn/causal_lm.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

namespace kqlora::bench {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
constexpr int64_t kRank = 8;

std::string config_json(const LlamaShape& s) {
  std::ostringstream os;
  os << "{\"model_type\": \"llama\", \"vocab_size\": " << s.vocab
     << ", \"hidden_size\": " << s.hidden << ", \"intermediate_size\": " << s.intermediate
     << ", \"num_hidden_layers\": " << s.layers << ", \"num_attention_heads\": " << s.heads
     << ", \"num_key_value_heads\": " << s.kv_heads << ", \"rms_norm_eps\": 1e-05"
     << ", \"rope_theta\": 100000.0, \"tie_word_embeddings\": " << (s.tied ? "true" : "false")
     << "}";
  return os.str();
}

void fill(const Kokkos::View<float*, Mem>& v, float scale, float offset, std::mt19937& gen,
          bool bf16 = false) {
  std::normal_distribution<float> dist;
  auto h = Kokkos::create_mirror_view(v);
  for (size_t i = 0; i < h.extent(0); ++i) {
    const float x = offset + scale * dist(gen);
    h(i) = bf16 ? round_to_bf16(x) : x;  // (bfloat16 values, as a bfloat16 run holds)
  }
  Kokkos::deep_copy(Exec(), v, h);
  fence(Exec(), "kqlora::bench::fill");  // (h is freed on return)
}

// Every tensor of the model from the generator: NF4 of N(0, 0.02^2) weights, norms near 1,
// the embedding N(0, 0.02^2), the adapters small (both non-zero, so every product runs on
// non-zero data).
void randomize(CausalLm<Exec>& model, std::mt19937& gen) {
  const Exec exec;
  for (const ParamEntry* e : model.table().of_kind(ParamKind::nf4)) {
    Kokkos::View<float*, Mem> w("kqlora::bench::w", e->numel());
    const Nf4Layout layout = e->nf4_layout();
    fill(w, 0.02f, 0.0f, gen, layout.dtype == DType::bfloat16);
    if (layout.dtype == DType::bfloat16) {  // (a bfloat16 run's NF4: of bfloat16 weights)
      Kokkos::View<bfloat16*, Mem> w16("kqlora::bench::w16", e->numel());
      Kokkos::parallel_for(
          "kqlora::bench::w16",
          Kokkos::RangePolicy<Exec, Kokkos::IndexType<int64_t>>(0, e->numel()),
          KOKKOS_LAMBDA(int64_t i) { w16(i) = bfloat16(w(i)); });
      model.nf4[e->offset] =
          nf4_quantize<bfloat16>(exec, Kokkos::View<const bfloat16*, Mem>(w16), layout, e->name);
    } else {
      model.nf4[e->offset] =
          nf4_quantize<float>(exec, Kokkos::View<const float*, Mem>(w), layout, e->name);
    }
  }
  for (const ParamEntry* e : model.table().of_kind(ParamKind::dense)) {
    Kokkos::View<float*, Mem> w("kqlora::bench::dense", e->numel());
    // (bfloat16 values in a bfloat16 run, as train/init.cpp holds them)
    fill(w, e->shape.size() == 1 ? 0.1f : 0.02f, e->shape.size() == 1 ? 1.0f : 0.0f, gen,
         e->dtype == DType::bfloat16);
    model.set_dense(*e, w);
  }
  fill(model.params, 0.02f, 0.0f, gen);
  model.params_changed();
}

/// Counts what runs while alive: kernels, deep copies and fences through Kokkos Tools
/// callbacks set in-process (both Kokkos 3.4 and 4.x have them; set only around the counted
/// call, as tools slow every launch down a little), and vendor GEMM calls. Where a tool
/// library is loaded (KOKKOS_TOOLS_LIBS) its callbacks are left alone: vendor GEMM calls
/// only.
class LaunchCounts {
 public:
  LaunchCounts() : gemm0_(gemm_calls()), tools_(!Kokkos::Profiling::profileLibraryLoaded()) {
    kernels_ = deep_copies_ = fences_ = 0;
    if (!tools_) return;
    namespace T = Kokkos::Tools::Experimental;
    T::set_begin_parallel_for_callback(&kernel_begun);
    T::set_begin_parallel_reduce_callback(&kernel_begun);
    T::set_begin_parallel_scan_callback(&kernel_begun);
    T::set_begin_deep_copy_callback(&copy_begun);
    T::set_begin_fence_callback(&fence_begun);
  }
  ~LaunchCounts() {
    if (!tools_) return;
    namespace T = Kokkos::Tools::Experimental;
    T::set_begin_parallel_for_callback(nullptr);
    T::set_begin_parallel_reduce_callback(nullptr);
    T::set_begin_parallel_scan_callback(nullptr);
    T::set_begin_deep_copy_callback(nullptr);
    T::set_begin_fence_callback(nullptr);
  }
  LaunchCounts(const LaunchCounts&) = delete;
  LaunchCounts& operator=(const LaunchCounts&) = delete;

  void into(Record& r) const {
    r.gemm_calls = static_cast<double>(gemm_calls() - gemm0_);
    if (!tools_) return;
    r.kernel_launches = static_cast<double>(kernels_.load());
    r.deep_copies = static_cast<double>(deep_copies_.load());
#if KOKKOS_VERSION >= 30600
    r.fences = static_cast<double>(fences_.load());
#endif
  }

 private:
  static inline std::atomic<uint64_t> kernels_{0}, deep_copies_{0}, fences_{0};
  uint64_t gemm0_;
  bool tools_;  // (the callbacks are ours)
  static void kernel_begun(const char*, uint32_t, uint64_t*) {
    kernels_.fetch_add(1, std::memory_order_relaxed);
  }
  static void copy_begun(Kokkos::Tools::SpaceHandle, const char*, const void*,
                         Kokkos::Tools::SpaceHandle, const char*, const void*, uint64_t) {
    deep_copies_.fetch_add(1, std::memory_order_relaxed);
  }
  static void fence_begun(const char* name, uint32_t, uint64_t*) {
    // Kokkos 4 fences around every kernel for a tool that does not say it needs no fences
    // ("... Kokkos Profile Tool Fence"): those are the counting's, not the step's.
    if (name && std::strstr(name, "Kokkos Profile Tool Fence")) return;
    fences_.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace

LlamaShape llama_shape(const std::string& name, int64_t layers) {
  LlamaShape s;
  if (name == "135m")
    s = {"135m", 49152, 576, 1536, 30, 9, 3, true};
  else if (name == "tiny")
    s = {"tiny", 512, 64, 128, 2, 4, 2, true};
  else
    KQLORA_INPUT_CHECK(false, "--llama: unknown shape '" << name << "' (135m or tiny)");
  if (layers > 0) {
    s.layers = layers;
    s.name += "_l" + std::to_string(layers);
  }
  return s;
}

void llama_records(const LlamaShape& shape, const std::vector<int64_t>& batches, int64_t seq,
                   int repeats, const std::string& filter, std::vector<Record>& out,
                   std::ostream& report, bool bf16, int64_t prompt) {
  const std::string prefix = "llama_";
  const char* kinds[] = {"fwd_bwd_", "attention_fwd_bwd_", "attention_gemm_fwd_bwd_",
                         "cross_entropy_", "lm_head_products_"};
  bool any = false;
  for (const char* k : kinds) any |= wanted(prefix + k + shape.name, filter);
  if (!any) return;
  const Exec exec;
  ModelConfig cfg;
  cfg.kind = "causal_lm";
  cfg.arch_text = config_json(shape);
  cfg.arch_source = "kqlora-bench " + shape.name;
  cfg.rank = kRank;
  cfg.lora_b_zeros = true;
  cfg.loss = LossKind::cross_entropy;
  if (bf16) cfg.dtype = DType::bfloat16;
  CausalLm<Exec> model(exec, cfg);
  std::mt19937 gen(5);
  randomize(model, gen);
  const DecoderSpec& a = model.spec();
  double peak = 0;
  for (const auto& r : out)
    if (r.name == "fma_peak_f32") peak = r.flops / r.median_s;

  for (int64_t n : batches) {
    const int64_t T = n * seq;
    const std::string tag = shape.name + "_b" + std::to_string(n) + "_t" + std::to_string(seq) +
                            (bf16 ? "_bf16" : "") +
                            (prompt > 0 ? "_p" + std::to_string(prompt) : "");
    Batch<Mem> b;
    b.tokens = TokenMatrix<Mem>("kqlora::bench::ids", n, seq);
    b.labels = TokenMatrix<Mem>("kqlora::bench::labels", n, seq);
    auto ids = Kokkos::create_mirror_view(b.tokens);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(a.vocab - 1));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t t = 0; t < seq; ++t) ids(i, t) = tok(gen);
    Kokkos::deep_copy(exec, b.tokens, ids);
    // A prompt's labels are not scored (their own mirror: ids may be b.tokens itself).
    auto lab = Kokkos::create_mirror_view(b.labels);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t t = 0; t < seq; ++t) lab(i, t) = t < prompt ? kIgnoreLabel : ids(i, t);
    Kokkos::deep_copy(exec, b.labels, lab);
    fence(exec, "kqlora::bench::batch");  // (ids and lab are freed at the end of the iteration)
    b.global_bs = n;
    const double normaliser =
        static_cast<double>(std::max<int64_t>(1, n * (seq - std::max<int64_t>(prompt, 1))));

    Record step{prefix + "fwd_bwd_" + tag};
    if (wanted(step.name, filter)) {
      step.median_s =
          median_seconds(repeats, [&] { model.forward_backward(b, normaliser, false); });
      step.flops = model.train_flops(n, seq);
      step.elements = static_cast<double>(T);
      step.bytes = 2.0 * static_cast<double>(model.nf4_bytes());  // the base, read twice
      {  // one more step, counted (after the timing, which the tools would slow down)
        LaunchCounts counts;
        model.forward_backward(b, normaliser, false);
        fence(exec, "kqlora::bench::counted_step");
        counts.into(step);
      }
      out.push_back(step);
      report << step.name << " per step: " << step.gemm_calls << " vendor GEMM calls, "
             << step.kernel_launches << " Kokkos kernels, " << step.deep_copies << " deep copies";
      if (step.fences >= 0) report << ", " << step.fences << " fences";
      report << "\n";
    }

    // The attention of every layer, forward and backward, on random q, k, v of the shape.
    Matrix<Mem> q("q", T, a.q_features()), k("k", T, a.kv_features()), v("v", T, a.kv_features());
    Matrix<Mem> o("o", T, a.q_features()), go("go", T, a.q_features());
    Matrix<Mem> gq("gq", T, a.q_features()), gk("gk", T, a.kv_features()),
        gv("gv", T, a.kv_features());
    Kokkos::View<float*, Mem> lse("lse", n * a.heads * seq);
    // (a bfloat16 run's attention reads bfloat16 values)
    auto fill_values = [&](const Matrix<Mem>& m) {
      fill(Kokkos::View<float*, Mem>(m.data(), m.size()), 1.0f, 0.0f, gen, bf16);
    };
    for (const auto& m : {q, k, v, go}) fill_values(m);
    const AttentionShape as{n, seq, a.heads, a.kv_heads, a.head_dim};
    const RopeTable<Mem> rope(a.ropes[0].inv_freq, seq, false);
    // The step's attention (on a host in float32 the fused kernel, nn/attention_host.hpp)
    // and, where that is fused, the gemm path beside it.
    auto attention_record = [&](const std::string& name, bool fused) {
      AttentionWorkspace<Mem> aws;
      aws.fused_host = fused;
      Record att{name};
      if (wanted(att.name, filter))
        att.median_s = median_seconds(repeats, [&] {
          for (int64_t l = 0; l < a.layers; ++l) {
            rope_apply(exec, rope, seq, a.head_dim, false, false, q);
            rope_apply(exec, rope, seq, a.head_dim, false, false, k);
            causal_attention_forward(exec, as, q, k, v, bf16, aws, o, lse);
            causal_attention_backward(exec, as, q, k, v, o, lse, go, bf16, aws, gq, gk, gv);
            rope_apply(exec, rope, seq, a.head_dim, true, false, gq);
            rope_apply(exec, rope, seq, a.head_dim, true, false, gk);
          }
        });
      att.flops = a.layers * a.heads * 6 * 2 * (n * seq * (seq + 1) / 2.0) * a.head_dim;
      return att;
    };
    const Record att = attention_record(prefix + "attention_fwd_bwd_" + tag, true);
    if (att.median_s > 0) out.push_back(att);
    if (impl::takes_fused_host_attention(AttentionWorkspace<Mem>(), bf16)) {
      const Record gemm_att = attention_record(prefix + "attention_gemm_fwd_bwd_" + tag, false);
      if (gemm_att.median_s > 0) out.push_back(gemm_att);
    }

    // The fused LM head and cross-entropy, and its two products alone, on random hidden
    // states and the tied head, over every token: with --llama-prompt only the step's
    // fwd_bwd record takes the scored rows alone (h is kept here, to repeat the call).
    Matrix<Mem> h("h", T, a.hidden), gh("gh", T, a.hidden);
    fill_values(h);
    const GemmInputs head_inputs = bf16 ? GemmInputs::bfloat16 : GemmInputs::float32;
    const ParamEntry& head =
        model.table().at(a.tied ? "model.embed_tokens.weight" : "lm_head.weight");
    const Matrix<Mem> W(model.dense[head.offset].data(), a.vocab, a.hidden);
    CrossEntropyWorkspace<Mem> cws;
    const float inv = static_cast<float>(1.0 / normaliser);
    Record fused{prefix + "lm_head_cross_entropy_" + tag};
    if (wanted(fused.name, filter))
      fused.median_s = median_seconds(repeats, [&] {
        lm_head_cross_entropy(exec, h, W, b.labels, normaliser, bf16, gh, cws, FinalLogits{},
                              head_inputs);
      });
    fused.flops = 2.0 * 2 * T * a.vocab * a.hidden;
    if (fused.median_s > 0) out.push_back(fused);
    // Its parts in the call's own geometry (nn/lm_head_cross_entropy.hpp): f(t0, tokens,
    // v0, logits) for each pass of tokens and vocabulary chunk (float32), or each chunk of
    // tokens over the whole vocabulary (v0 -1: bfloat16).
    Record products{prefix + "lm_head_products_" + tag}, ce{prefix + "cross_entropy_" + tag};
    if ((wanted(products.name, filter) || wanted(ce.name, filter)) && cws.logits.extent(0) == 0)
      lm_head_cross_entropy(exec, h, W, b.labels, normaliser, bf16, gh, cws, FinalLogits{},
                            head_inputs);  // (the workspace, and a head's 16-bit copy)
    const bool by_vocab = CrossEntropyWorkspace<Mem>::by_vocab_chunks(bf16);
    const auto chunking = cws.chunking(T, a.vocab, bf16);
    const int64_t pass = chunking.tokens, vchunk = chunking.vocab;
    auto chunks = [&](auto&& f) {
      for (int64_t t0 = 0; t0 < T; t0 += pass) {
        const int64_t m = std::min(pass, T - t0);
        for (int64_t v0 = 0; v0 < a.vocab; v0 += vchunk) {
          const int64_t vc = std::min(vchunk, a.vocab - v0);
          f(t0, Kokkos::make_pair(t0, t0 + m), by_vocab ? v0 : -1,
            Matrix<Mem>(cws.logits.data(), m, vc));
        }
      }
    };
    if (wanted(products.name, filter))
      products.median_s = median_seconds(repeats, [&] {
        chunks([&](int64_t, auto rows, int64_t v0, const Matrix<Mem>& lg) {
          const auto hs = Kokkos::subview(h, rows, Kokkos::ALL);
          const auto g = Kokkos::subview(gh, rows, Kokkos::ALL);
          if (cws.head16_of == W.data()) {  // (the bfloat16 products over the head's 16-bit copy)
            const uint16_t* w16 = cws.head16.data();
            gemm_bf16_weight("N", "T", 1.0f, hs, w16, a.vocab, a.hidden, a.hidden, 0.0f, lg);
            gemm_bf16_weight("N", "N", 1.0f, lg, w16, a.vocab, a.hidden, a.hidden, 0.0f, g);
            return;
          }
          const int64_t w0 = std::max<int64_t>(v0, 0), wn = static_cast<int64_t>(lg.extent(1));
          const auto Wc = Kokkos::subview(W, Kokkos::make_pair(w0, w0 + wn), Kokkos::ALL);
          gemm(exec, "N", "T", 1.0f, hs, Wc, 0.0f, lg, head_inputs);
          gemm(exec, "N", "N", 1.0f, lg, Wc, v0 > 0 ? 1.0f : 0.0f, g, head_inputs);
        });
      });
    products.flops = fused.flops;
    if (products.median_s > 0) out.push_back(products);
    // The softmax, loss and gradient alone, over logits the products left (each run turns
    // them into gradients, or the weights of G's terms: finite values, the same work), with
    // G's rescaling and the gradient's final pass in float32.
    if (wanted(ce.name, filter))
      ce.median_s = median_seconds(repeats, [&] {
        chunks([&](int64_t t0, auto rows, int64_t v0, const Matrix<Mem>& lg) {
          if (v0 < 0) {
            impl::cross_entropy_rows(exec, lg, b.labels, t0, inv, bf16, true, cws.row_loss);
            return;
          }
          const Matrix<Mem> g = Kokkos::subview(gh, rows, Kokkos::ALL);
          if (v0 == 0) impl::vocab_chunk_start(exec, cws.rows, lg.extent(0));
          impl::vocab_chunk_softmax(exec, lg, RowLabels<Mem>(b.labels), t0, v0, 0.0f, true,
                                    cws.rows);
          if (v0 > 0) impl::vocab_chunk_rescale(exec, cws.rows, g);
          if (v0 + static_cast<int64_t>(lg.extent(1)) == a.vocab)
            impl::vocab_chunk_finish(exec, RowLabels<Mem>(b.labels), t0, lg.extent(0), inv, W,
                                     cws.rows, cws.row_loss, g);
        });
      });
    ce.elements = static_cast<double>(T) * a.vocab;
    ce.bytes = 2.0 * 4 * ce.elements;  // (and, over vocabulary chunks, passes over G [T, hidden])
    if (ce.median_s > 0) out.push_back(ce);
    if (step.median_s == 0 || att.median_s == 0 || ce.median_s == 0 || products.median_s == 0)
      continue;  // (the shares need every part)

    report << std::fixed << std::setprecision(1) << step.name << ": "
           << step.flops / step.median_s / 1e9 << " GFLOP/s (model FLOPs)";
    if (peak > 0) report << ", " << 100 * step.flops / step.median_s / peak << "% of fma_peak_f32";
    report << "; attention forward + backward " << 100 * att.median_s / step.median_s
           << "% of the step; cross-entropy (softmax, loss, gradient) "
           << 100 * ce.median_s / step.median_s << "%; LM head products "
           << 100 * products.median_s / step.median_s << "%\n"
           << std::defaultfloat;
  }
}

}  // namespace kqlora::bench
