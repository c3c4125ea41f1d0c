// kqlora-bench: kernel benchmarks, a table on stdout and optionally JSON records
// (name, median_s, bytes, flops). Run one thread per rank (OMP_NUM_THREADS=1,
// OPENBLAS_NUM_THREADS=1) unless a record says otherwise.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <type_traits>

#include "app_main.hpp"
#include "bench_gated_deltanet.hpp"
#include "bench_gemm_engines.hpp"
#include "bench_llama.hpp"
#include "bench_record.hpp"
#include "bench_tensor_read.hpp"
#include "kqlora/core/atomic_output.hpp"
#include "kqlora/core/build_info.hpp"
#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/fma_peak.hpp"
#include "kqlora/core/output_guard.hpp"
#include "kqlora/nn/linear_nf4.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

namespace {

const char* usage =
    "usage: kqlora-bench [--json FILE] [--filter TEXT] [--sizes N,...] [--tokens T,...]\n"
    "                    [--linear-dim N] [--gemm-size N] [--repeats N] [--pairs N]\n"
    "                    [--delta-tokens T,...]\n"
    "\n"
    "Benchmarks kqlora's kernels and prints a table (median time, bandwidth, throughput).\n"
    "Records:\n"
    "  fma_peak_f32             one core's float32 FMA peak: a register-only loop at the\n"
    "                           widest vector FMA this CPU has (chosen at run time)\n"
    "  gemm_f32_N               C = A B^T, N x N x N float32 (--gemm-size), through kqlora's\n"
    "                           gemm (the host GEMM engine); its share of fma_peak_f32 is printed\n"
    "For each size N (--sizes), an N x N weight:\n"
    "  memcpy_NxN_f32           a copy of the float32 output size (bandwidth reference:\n"
    "                           std::memcpy, or a device-to-device copy on a GPU)\n"
    "  nf4_dequant_NxN_f32|bf16 NF4 -> float32 / bfloat16 (the NF4 dtype's own)\n"
    "  nf4_quant_NxN_f32|bf16   float32 / bfloat16 -> NF4\n"
    "  qlora_linear_fwd_bwd_tT  a LoRA linear (--linear-dim, rank 16, float32) forward and\n"
    "                           backward over T tokens, NF4 base (linear_nf4's choice)\n"
    "  dense_lora_linear_fwd_bwd_tT  the same over a dense frozen float32 base\n"
    "                           (the two run as interleaved pairs; the median of the\n"
    "                           per-pair time ratios is printed and stored as ratio_to_dense)\n"
    "  fwd|bwd_nf4_fused|panels_tT  the NF4 base's forward or input-gradient product alone,\n"
    "                           through the fused kernel (AVX-512 builds) or dequantized\n"
    "                           row panels, each against the dense product (interleaved)\n"
    "Llama (--llama SHAPE), B sequences of T tokens (--llama-batches, --llama-seq):\n"
    "  llama_fwd_bwd_SHAPE_bB_tT  a QLoRA Llama's forward and backward (all seven\n"
    "                           projections adapted, rank 8; model FLOPs, docs/BENCHMARKS.md)\n"
    "  llama_attention_fwd_bwd_..., llama_lm_head_cross_entropy_...,\n"
    "  llama_lm_head_products_..., llama_cross_entropy_...  its parts: every layer's\n"
    "                           attention, the fused LM head and cross-entropy, its two\n"
    "                           products alone, its softmax, loss and gradient alone\n"
    "  llama_attention_gemm_fwd_bwd_...  the attention through gemm, beside the host's\n"
    "                           fused float32 kernel (AVX-512 builds)\n"
    "  (llama_fwd_bwd_... also counts one step's launches, in its JSON record and the\n"
    "  report: gemm_calls (vendor GEMM calls: cuBLAS, the host BLAS, oneDNN), and through\n"
    "  Kokkos Tools callbacks kernel_launches, deep_copies and fences (Kokkos >= 3.6);\n"
    "  with --llama-layers 1 and 2, the difference is one layer's and the rest the\n"
    "  embedding, the final norm and the LM head's)\n"
    "  gated_deltanet_fwd_bwd_tT  a Qwen3.5-2B-like Gated DeltaNet layer's token mixer\n"
    "                           (16 key and value heads of 128) forward and backward over one\n"
    "                           row of T tokens (--delta-tokens, default 1024,16384); its time\n"
    "                           a token against the first T's is printed\n"
    "  tensor_read_NxN_f32|bf16[_plain]  for each size N, a base tensor read from a\n"
    "                           safetensors file (page cache) into float32 as set-up reads it\n"
    "                           (NaN and Inf looked for in the same pass), and the plain read\n"
    "                           without the check, as --pairs interleaved pairs (median ratio)\n"
    "  gemm_engine_PRODUCT_SHAPE_tN_blas|onednn  the step's products at N = B x T tokens\n"
    "                           (projections, LM head chunk, attention block, LoRA) through\n"
    "                           each host GEMM engine, as --pairs interleaved pairs; the\n"
    "                           median per-pair ratio is printed (oneDNN builds)\n"
    "Bytes count what a kernel reads plus what it writes.\n"
    "\n"
    "  --json FILE     also write the records as a JSON list\n"
    "  --filter LIST   only records whose name contains one of the comma-separated texts\n"
    "                  (e.g. fma_peak,llama)\n"
    "  --sizes LIST    NF4 matrix sizes (default 4096,8192)\n"
    "  --tokens LIST   token counts of the linear records (default 256,2048)\n"
    "  --linear-dim N  the linear records' dim (default 4096)\n"
    "  --gemm-size N   the gemm record's size (default 2048)\n"
    "  --repeats N     timed repetitions per record, after one warm-up (default 7)\n"
    "  --pairs N       interleaved QLoRA/dense pairs per token count (default 15)\n"
    "  --llama SHAPE   the Llama records' shape: 135m (SmolLM2-135M, default) or tiny;\n"
    "                  none: no Llama records\n"
    "  --llama-batches LIST  sequences per step (default 1,4)\n"
    "  --llama-seq T   tokens per sequence (default 256)\n"
    "  --llama-layers N  the shape with N decoder layers (its records named SHAPE_lN)\n"
    "  --llama-prompt N  the first N tokens of each sequence are a prompt: not scored\n"
    "                  (label -100; default 0); the records' names end in _pN\n"
    "  --llama-dtype D float32 (default) or bfloat16: the NF4 weights and the compute (the\n"
    "                  records' names end in _bf16)\n"
    "  --version       version and build configuration\n";

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

using kqlora::bench::median;
using kqlora::bench::median_seconds;
using kqlora::bench::Record;
using kqlora::bench::seconds;

void fma_peak_record(int repeats, const std::string& filter, std::vector<Record>& out) {
  const std::string name = "fma_peak_f32";
  if (!kqlora::bench::wanted(name, filter)) return;
  const auto loop = kqlora::fma_loop();
  // About 0.1 s per repetition.
  int64_t iterations = 1 << 20;
  const double t = seconds([&] { kqlora::run_fma_loop(loop, iterations); });
  iterations = std::max<int64_t>(iterations, static_cast<int64_t>(iterations * 0.1 / t));
  Record r{name};
  r.median_s = median_seconds(repeats, [&] { kqlora::run_fma_loop(loop, iterations); });
  r.flops = loop.flops_per_iteration * static_cast<double>(iterations);
  out.push_back(r);
  std::cout << "FMA peak loop: " << loop.name << " (" << loop.width_bits << "-bit)\n";
}

using M = kqlora::Matrix<Mem>;

void fill_random(const M& m, float scale, std::mt19937& gen) {
  std::normal_distribution<float> dist;
  auto h = Kokkos::create_mirror_view(m);
  for (size_t j = 0; j < m.extent(1); ++j)
    for (size_t i = 0; i < m.extent(0); ++i) h(i, j) = scale * dist(gen);
  Kokkos::deep_copy(m, h);  // device-wide: bench set-up, before the timing
}

/// C = A B^T, n x n x n, through kqlora's gemm.
void gemm_record(int64_t n, int repeats, const std::string& filter, std::vector<Record>& out) {
  const std::string name = "gemm_f32_" + std::to_string(n);
  if (!kqlora::bench::wanted(name, filter)) return;
  std::mt19937 gen(11);
  M A("A", n, n), B("B", n, n), C("C", n, n);
  fill_random(A, 1.0f, gen);
  fill_random(B, 1.0f, gen);
  Exec exec;
  Record r{name};
  r.median_s = median_seconds(repeats, [&] { kqlora::gemm(exec, "N", "T", 1.0f, A, B, 0.0f, C); });
  const double d = static_cast<double>(n);
  r.flops = 2 * d * d * d;
  r.bytes = 3 * 4 * d * d;
  r.elements = d * d;
  out.push_back(r);
}

template <class T>
void nf4_records(int64_t n, int repeats, const std::string& filter, std::vector<Record>& out) {
  const std::string tag = std::is_same<T, float>::value ? "f32" : "bf16";
  const std::string size = std::to_string(n) + "x" + std::to_string(n);
  const std::string qname = "nf4_quant_" + size + "_" + tag;
  const std::string dname = "nf4_dequant_" + size + "_" + tag;
  const bool want_q = kqlora::bench::wanted(qname, filter);
  const bool want_d = kqlora::bench::wanted(dname, filter);
  if (!want_q && !want_d) return;
  Exec exec;
  const int64_t numel = n * n;
  Kokkos::View<T*, Mem> w(Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::w"), numel);
  {
    auto h = Kokkos::create_mirror_view(w);
    std::mt19937 gen(1234);
    std::normal_distribution<float> dist;
    for (int64_t i = 0; i < numel; ++i) h(i) = T(dist(gen));
    Kokkos::deep_copy(w, h);  // device-wide: bench set-up, before the timing
  }
  kqlora::Nf4Layout layout;
  layout.shape = {n, n};
  auto nf4 = kqlora::nf4_quantize<T>(exec, Kokkos::View<const T*, Mem>(w), layout);
  const double nf4_bytes = static_cast<double>(nf4.storage_bytes());
  if (want_q) {
    Record r{qname};
    r.median_s = median_seconds(repeats, [&] {
      nf4 = kqlora::nf4_quantize<T>(exec, Kokkos::View<const T*, Mem>(w), layout);
    });
    r.bytes = numel * sizeof(T) + nf4_bytes;
    r.elements = numel;
    out.push_back(r);
  }
  if (want_d) {
    Kokkos::View<T*, Mem> y(Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::y"), numel);
    Record r{dname};
    r.median_s = median_seconds(repeats, [&] { kqlora::nf4_dequantize(exec, nf4, y); });
    r.bytes = nf4_bytes + numel * sizeof(T);
    r.elements = numel;
    out.push_back(r);
  }
}

/// One LoRA linear layer (dim x dim, rank r, float32) forward and backward, as in a stack
/// (the input gradient included), over an NF4 base (panels dequantized per call) and over
/// a dense frozen float32 base, both through the same BLAS, timed as interleaved pairs
/// (which of the two runs first alternates) so that the machine's drift cancels in the
/// per-pair ratios.
void lora_linear_records(int64_t dim, int64_t rank, int64_t tokens, int pairs,
                         const std::string& filter, std::vector<Record>& out) {
  const std::string qname = "qlora_linear_fwd_bwd_t" + std::to_string(tokens);
  const std::string dname = "dense_lora_linear_fwd_bwd_t" + std::to_string(tokens);
  const bool want_q = kqlora::bench::wanted(qname, filter);
  const bool want_d = kqlora::bench::wanted(dname, filter);
  if (!want_q && !want_d) return;
  Exec exec;
  std::mt19937 gen(7);
  M x("x", tokens, dim), y("y", tokens, dim), gy("gy", tokens, dim), gx("gx", tokens, dim);
  M h("h", tokens, rank), gh("gh", tokens, rank), A("A", rank, dim), B("B", dim, rank);
  M gA("gA", rank, dim), gB("gB", dim, rank), Wd("W", dim, dim);  // W [out, in]
  fill_random(x, 1.0f, gen);
  fill_random(gy, 1.0f, gen);
  fill_random(A, 0.02f, gen);
  fill_random(B, 0.02f, gen);
  fill_random(Wd, 0.02f, gen);
  kqlora::Nf4Layout layout;
  layout.shape = {dim, dim};
  auto W = kqlora::nf4_quantize<float>(exec, Kokkos::View<const float*, Mem>(Wd.data(), dim * dim),
                                       layout);
  kqlora::LinearNf4Workspace<Mem> ws;
  const float s = 16.0f / rank;
  auto step = [&](bool nf4) {
    kqlora::gemm(exec, "N", "T", 1.0f, x, A, 0.0f, h);  // forward: h = x A^T
    if (nf4)
      kqlora::linear_nf4_forward(exec, W, x, y, ws);
    else
      kqlora::gemm(exec, "N", "T", 1.0f, x, Wd, 0.0f, y);  // y = x W^T
    kqlora::gemm(exec, "N", "T", s, h, B, 1.0f, y);        // y += s h B^T
    kqlora::gemm(exec, "T", "N", s, gy, h, 1.0f, gB);      // backward: dB += s gy^T h
    kqlora::gemm(exec, "N", "N", s, gy, B, 0.0f, gh);      // gh = s gy B
    kqlora::gemm(exec, "T", "N", 1.0f, gh, x, 1.0f, gA);   // dA += gh^T x
    if (nf4)
      kqlora::linear_nf4_backward(exec, W, gy, gx, ws);
    else
      kqlora::gemm(exec, "N", "N", 1.0f, gy, Wd, 0.0f, gx);  // gx = gy W
    kqlora::gemm(exec, "N", "N", 1.0f, gh, A, 1.0f, gx);     // gx += gh A
  };
  if (want_q) step(true);  // warm-up: page faults, the panel workspace
  if (want_d) step(false);
  std::vector<double> tq, td, ratio;
  for (int p = 0; p < pairs; ++p) {
    const bool q_first = p % 2 == 0;
    double a = 0, b = 0;
    if (want_q && q_first) a = seconds([&] { step(true); });
    if (want_d) b = seconds([&] { step(false); });
    if (want_q && !q_first) a = seconds([&] { step(true); });
    if (want_q) tq.push_back(a);
    if (want_d) td.push_back(b);
    if (want_q && want_d) ratio.push_back(a / b);
  }
  const double T = static_cast<double>(tokens), d = static_cast<double>(dim),
               rr = static_cast<double>(rank);
  const double flops = 2 * T * d * d * 2 + 2 * T * d * rr * 5;  // two dim^2 products, five rank-r
  const double act_bytes = 4 * T * d * 4;                       // x, y, gy, gx
  if (want_q) {
    Record r{qname, median(tq), 2.0 * W.storage_bytes() + act_bytes, flops, T};  // base read twice
    if (!ratio.empty()) r.ratio_to_dense = median(ratio);
    out.push_back(r);
  }
  if (want_d) out.push_back(Record{dname, median(td), 2.0 * 4 * d * d + act_bytes, flops, T});
}

/// The NF4 base's two products alone (forward y = x W^T, input gradient gx = gy W; dim x
/// dim, float32 NF4) through the fused kernel and through dequantized row panels, each
/// against the same product over a dense float32 W, timed as interleaved triples (the
/// order rotates): the numbers behind linear_nf4's choice between the two
/// (kFusedMaxTokens).
void nf4_product_records(int64_t dim, int64_t tokens, int pairs, const std::string& filter,
                         std::vector<Record>& out) {
  kqlora::Nf4Layout layout;
  layout.shape = {dim, dim};
  const bool fused_here = kqlora::impl::nf4_gemm_host_supports(layout) &&
                          std::is_same<Exec, Kokkos::DefaultHostExecutionSpace>::value;
  for (const char* op : {"fwd", "bwd"}) {
    const std::string t = "_t" + std::to_string(tokens);
    const std::string fname = std::string(op) + "_nf4_fused" + t;
    const std::string pname = std::string(op) + "_nf4_panels" + t;
    const bool want_f = fused_here && kqlora::bench::wanted(fname, filter);
    const bool want_p = kqlora::bench::wanted(pname, filter);
    if (!want_f && !want_p) continue;
    Exec exec;
    std::mt19937 gen(11);
    M x("x", tokens, dim), y("y", tokens, dim), Wd("W", dim, dim);
    fill_random(x, 1.0f, gen);
    fill_random(Wd, 0.02f, gen);
    auto W = kqlora::nf4_quantize<float>(
        exec, Kokkos::View<const float*, Mem>(Wd.data(), dim * dim), layout);
    kqlora::LinearNf4Workspace<Mem> fused_ws, panel_ws;
    fused_ws.product = kqlora::Nf4Product::fused;
    panel_ws.product = kqlora::Nf4Product::panels;
    const bool forward = op[0] == 'f';
    auto nf4 = [&](kqlora::LinearNf4Workspace<Mem>& ws) {
      if (forward)
        kqlora::linear_nf4_forward(exec, W, x, y, ws);
      else
        kqlora::linear_nf4_backward(exec, W, x, y, ws);  // gx = gy W: x as gy
    };
    auto dense = [&] { kqlora::gemm(exec, "N", forward ? "T" : "N", 1.0f, x, Wd, 0.0f, y); };
    if (want_f) nf4(fused_ws);  // warm-up: page faults, the workspaces
    if (want_p) nf4(panel_ws);
    dense();
    std::vector<double> tf, tp, td, rf, rp;
    for (int p = 0; p < pairs; ++p) {
      double a = 0, b = 0, c = 0;
      for (int i = 0; i < 3; ++i) {
        switch ((p + i) % 3) {
          case 0:
            if (want_f) a = seconds([&] { nf4(fused_ws); });
            break;
          case 1:
            if (want_p) b = seconds([&] { nf4(panel_ws); });
            break;
          default:
            c = seconds(dense);
        }
      }
      tf.push_back(a);
      tp.push_back(b);
      td.push_back(c);
      rf.push_back(a / c);
      rp.push_back(b / c);
    }
    const double flops = 2.0 * tokens * dim * dim;
    if (want_f) {
      Record r{fname, median(tf), 0.5 * dim * dim + 8.0 * tokens * dim, flops, double(tokens)};
      r.ratio_to_dense = median(rf);
      out.push_back(r);
    }
    if (want_p) {
      Record r{pname, median(tp), 0.5 * dim * dim + 8.0 * tokens * dim, flops, double(tokens)};
      r.ratio_to_dense = median(rp);
      out.push_back(r);
    }
  }
}

/// The copy the NF4 records compare with, of their float32 output's size: std::memcpy on
/// a host, a device-to-device copy where the default memory space is a GPU's.
void memcpy_record(int64_t n, int repeats, const std::string& filter, std::vector<Record>& out) {
  const std::string name = "memcpy_" + std::to_string(n) + "x" + std::to_string(n) + "_f32";
  if (!kqlora::bench::wanted(name, filter)) return;
  const size_t bytes = static_cast<size_t>(n * n) * sizeof(float);
  Record r{name};
  if (std::is_same<Mem, Kokkos::HostSpace>::value) {
    std::vector<float> a(n * n, 1.0f), b(n * n, 0.0f);  // touched: no page faults timed
    r.median_s = median_seconds(repeats, [&] { std::memcpy(b.data(), a.data(), bytes); });
  } else {
    Exec exec;
    Kokkos::View<float*, Mem> a("bench::copy_from", n * n), b("bench::copy_to", n * n);
    r.median_s = median_seconds(repeats, [&] { Kokkos::deep_copy(exec, b, a); });
  }
  r.bytes = 2.0 * bytes;
  r.elements = static_cast<double>(n * n);
  out.push_back(r);
}

/// A comma-separated list of positive integers (an option's value).
std::vector<int64_t> positive_list(const std::string& text, const char* option) {
  std::vector<int64_t> v;
  std::stringstream ss(text);
  for (std::string s; std::getline(ss, s, ',');) {
    const long long x = kqlora::parse_integer(s, option);
    KQLORA_INPUT_CHECK(x > 0, option << ": " << x << " must be positive");
    v.push_back(x);
  }
  return v;
}

int bench_main(std::vector<std::string>& args) {
  std::string json_path, filter, sizes_text = "4096,8192", tokens_text = "256,2048", v;
  int repeats = 7;
  // (Checked up front: a benchmark of minutes does not end in "cannot write".)
  if (kqlora::app::take_option(args, "--json", &json_path))
    kqlora::check_file_output("--json", json_path);
  kqlora::app::take_option(args, "--filter", &filter);
  kqlora::app::take_option(args, "--sizes", &sizes_text);
  kqlora::app::take_option(args, "--tokens", &tokens_text);
  int64_t linear_dim = 4096, gemm_size = 2048;
  int pairs = 15;
  if (kqlora::app::take_option(args, "--linear-dim", &v))
    linear_dim = kqlora::parse_integer(v, "--linear-dim");
  if (kqlora::app::take_option(args, "--gemm-size", &v))
    gemm_size = kqlora::parse_integer(v, "--gemm-size");
  // Counts are range-checked before they become ints.
  const auto count = [](const std::string& text, const char* option) {
    const long long x = kqlora::parse_integer(text, option);
    KQLORA_INPUT_CHECK(x >= 1 && x <= 1000000, option << " must be in 1..1000000, got " << x);
    return static_cast<int>(x);
  };
  if (kqlora::app::take_option(args, "--repeats", &v)) repeats = count(v, "--repeats");
  if (kqlora::app::take_option(args, "--pairs", &v)) pairs = count(v, "--pairs");
  std::string delta_tokens_text = "1024,16384";
  kqlora::app::take_option(args, "--delta-tokens", &delta_tokens_text);
  const auto delta_tokens = positive_list(delta_tokens_text, "--delta-tokens");
  std::string llama = "135m", llama_batches_text = "1,4", llama_dtype = "float32";
  int64_t llama_seq = 256;
  kqlora::app::take_option(args, "--llama", &llama);
  kqlora::app::take_option(args, "--llama-batches", &llama_batches_text);
  kqlora::app::take_option(args, "--llama-dtype", &llama_dtype);
  KQLORA_INPUT_CHECK(llama_dtype == "float32" || llama_dtype == "bfloat16",
                     "--llama-dtype: float32 or bfloat16, got '" << llama_dtype << "'");
  if (kqlora::app::take_option(args, "--llama-seq", &v))
    llama_seq = kqlora::parse_integer(v, "--llama-seq");
  KQLORA_INPUT_CHECK(llama_seq >= 2, "--llama-seq must be at least 2");
  int64_t llama_prompt = 0;
  if (kqlora::app::take_option(args, "--llama-prompt", &v))
    llama_prompt = kqlora::parse_integer(v, "--llama-prompt");
  KQLORA_INPUT_CHECK(llama_prompt >= 0 && llama_prompt < llama_seq,
                     "--llama-prompt must be in 0.." << llama_seq - 1 << ", got " << llama_prompt);
  int64_t llama_layers = 0;  // (0: the shape's own)
  if (kqlora::app::take_option(args, "--llama-layers", &v)) {
    llama_layers = kqlora::parse_integer(v, "--llama-layers");
    KQLORA_INPUT_CHECK(llama_layers >= 1 && llama_layers <= 1000,
                       "--llama-layers must be in 1..1000, got " << llama_layers);
  }
  const auto llama_batches = positive_list(llama_batches_text, "--llama-batches");
  for (int64_t b : llama_batches)
    kqlora::checked_mul(b, llama_seq, "--llama-batches x --llama-seq");
  KQLORA_INPUT_CHECK(args.empty(), "unexpected argument '" << args[0] << "' (see --help)");
  KQLORA_INPUT_CHECK(repeats >= 1, "--repeats must be at least 1");
  KQLORA_INPUT_CHECK(pairs >= 1, "--pairs must be at least 1");
  KQLORA_INPUT_CHECK(gemm_size >= 1, "--gemm-size must be at least 1");
  kqlora::checked_mul(gemm_size, gemm_size, "--gemm-size");
  const auto sizes = positive_list(sizes_text, "--sizes");
  for (int64_t n : sizes)
    KQLORA_INPUT_CHECK(kqlora::checked_mul(n, n, "--sizes") % 16384 == 0,
                       "--sizes: " << n << " x " << n << " is not a multiple of 16384 elements");
  const auto tokens = positive_list(tokens_text, "--tokens");
  KQLORA_INPUT_CHECK(
      linear_dim > 0 && kqlora::checked_mul(linear_dim, linear_dim, "--linear-dim") % 64 == 0,
      "--linear-dim " << linear_dim << ": dim*dim must be a multiple of 64");
  for (int64_t t : tokens) kqlora::checked_mul(t, linear_dim, "--tokens x --linear-dim");

  std::cout << kqlora::build_configuration() << "  threads: " << Exec().concurrency() << "\n\n";
  std::vector<Record> records;
  fma_peak_record(repeats, filter, records);
  gemm_record(gemm_size, repeats, filter, records);
  for (int64_t n : sizes) {
    memcpy_record(n, repeats, filter, records);
    nf4_records<float>(n, repeats, filter, records);
    nf4_records<kqlora::bfloat16>(n, repeats, filter, records);
  }
  for (int64_t t : tokens) lora_linear_records(linear_dim, 16, t, pairs, filter, records);
  for (int64_t t : tokens) nf4_product_records(linear_dim, t, pairs, filter, records);
  std::ostringstream llama_report;
  for (int64_t n : sizes) kqlora::bench::tensor_read_records(n, pairs, filter, records);
  kqlora::bench::gated_deltanet_records(delta_tokens, repeats, filter, records);
  kqlora::bench::LlamaShape shape;
  if (llama != "none") shape = kqlora::bench::llama_shape(llama, llama_layers);
  if (llama != "none")
    for (int64_t b : llama_batches)
      kqlora::bench::gemm_engine_records(shape, b * llama_seq, pairs, filter, records,
                                         llama_report);
  if (llama != "none")
    kqlora::bench::llama_records(shape, llama_batches, llama_seq, repeats, filter, records,
                                 llama_report, llama_dtype == "bfloat16", llama_prompt);

  // Columns that do not apply to a record stay empty.
  std::cout << std::left << std::setw(32) << "record" << std::right << std::setw(12) << "median ms"
            << std::setw(10) << "GB/s" << std::setw(12) << "Melem/s" << std::setw(12) << "vs memcpy"
            << std::setw(10) << "GFLOP/s"
            << "\n";
  double memcpy_bw = 0;
  for (const auto& r : records) {
    const double bw = r.bytes / r.median_s / 1e9;
    const bool nf4 = r.name.rfind("nf4_", 0) == 0, copy = r.name.rfind("memcpy_", 0) == 0;
    if (copy) memcpy_bw = bw;
    std::ostringstream elem, vs, gflops;
    elem << std::fixed << std::setprecision(1);
    vs << std::fixed << std::setprecision(1);
    gflops << std::fixed << std::setprecision(1);
    if (nf4 || copy) elem << r.elements / r.median_s / 1e6;
    if (nf4 && memcpy_bw > 0) vs << 100 * bw / memcpy_bw << "%";
    if (r.flops > 0) gflops << r.flops / r.median_s / 1e9;
    std::cout << std::left << std::setw(32) << r.name << std::right << std::fixed
              << std::setprecision(3) << std::setw(12) << r.median_s * 1e3 << std::setprecision(2)
              << std::setw(10) << bw << std::setw(12) << elem.str() << std::setw(12) << vs.str()
              << std::setw(10) << gflops.str() << std::defaultfloat << "\n";
  }
  // The ratios the targets are about (docs/BENCHMARKS.md).
  double peak = 0;
  for (const auto& r : records) {
    if (r.name == "fma_peak_f32") peak = r.flops / r.median_s;
    if (r.name.rfind("gemm_f32_", 0) == 0 && peak > 0)
      std::cout << r.name << " / fma_peak_f32: " << std::fixed << std::setprecision(1)
                << 100 * r.flops / r.median_s / peak << "% of one core's FMA peak\n";
    if (r.ratio_to_dense > 0 && r.name.rfind("gated_deltanet_", 0) == 0)
      std::cout << r.name << ": " << std::fixed << std::setprecision(3)
                << 1e6 * r.median_s / r.elements << " us a token, " << r.ratio_to_dense
                << "x the first length's per token\n";
    else if (r.ratio_to_dense > 0)
      std::cout << r.name
                << (r.name.rfind("tensor_read_", 0) == 0 ? " / plain read: " : " / dense: ")
                << std::fixed << std::setprecision(3) << r.ratio_to_dense << "x (median of "
                << pairs << " interleaved pair ratios)\n";
  }
  std::cout << std::defaultfloat << llama_report.str();
  if (!json_path.empty()) {
    kqlora::FileOutput out(json_path);  // (renamed into place: an earlier file stays whole)
    std::ofstream f(out.temp());
    KQLORA_CHECK(f.good(), json_path << ": cannot write " << out.temp());
    f << "[\n";
    for (size_t i = 0; i < records.size(); ++i) {
      const auto& r = records[i];
      f << "  {\"name\": \"" << r.name << "\", \"median_s\": " << std::setprecision(9) << r.median_s
        << ", \"bytes\": " << std::setprecision(15) << r.bytes << ", \"flops\": " << r.flops
        << ", \"elements\": " << r.elements;
      if (r.ratio_to_dense > 0)
        f << ", \"ratio_to_dense\": " << std::setprecision(6) << r.ratio_to_dense;
      const std::pair<const char*, double> counts[] = {{"gemm_calls", r.gemm_calls},
                                                       {"kernel_launches", r.kernel_launches},
                                                       {"deep_copies", r.deep_copies},
                                                       {"fences", r.fences}};
      for (const auto& [key, n] : counts)
        if (n >= 0) f << ", \"" << key << "\": " << std::setprecision(15) << n;
      f << "}" << (i + 1 < records.size() ? "," : "") << "\n";
    }
    f << "]\n";
    f.close();
    KQLORA_CHECK(!f.fail(), json_path << ": write failed");
    out.commit();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kqlora::app::run(argc, argv, "kqlora-bench", usage, bench_main);
}
