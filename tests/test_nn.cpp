// linear_nf4 and the LoRA model: outputs against a float64 reference built from the
// dequantized weights, and every gradient against float64 central finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "exec_spaces.hpp"
#include "kqlora/core/gemm_engine.hpp"
#include "kqlora/nn/linear_nf4.hpp"
#include "kqlora/nn/lora_stack.hpp"
#include "kqlora/nn/loss.hpp"
#include "matrix_util.hpp"
#include "nf4_test_util.hpp"

using namespace nf4test;
using kqlora::Activation;
using kqlora::Matrix;

namespace {

using HostMat = std::vector<double>;  // [rows][cols] row-major, double

std::vector<double> dequantized(const HostNf4& t) {
  auto f = dequantize<float>(t);
  return std::vector<double>(f.begin(), f.end());
}

template <class M = Mem>
Matrix<M> to_matrix(const std::vector<float>& rowmajor, int64_t rows, int64_t cols) {
  return kqlora_test::matrix<M>(rowmajor, rows, cols);
}

template <class M>
std::vector<double> from_matrix(const Matrix<M>& m) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  std::vector<double> v(m.extent(0) * m.extent(1));
  for (size_t r = 0; r < m.extent(0); ++r)
    for (size_t c = 0; c < m.extent(1); ++c) v[r * m.extent(1) + c] = h(r, c);
  return v;
}

double act(Activation a, double z) {
  switch (a) {
    case Activation::relu:
      return z > 0 ? z : 0;
    case Activation::gelu:
      return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
    case Activation::silu:
      return z / (1 + std::exp(-z));
    default:
      return z;
  }
}

}  // namespace

template <class E>
class LinearNf4 : public ::testing::Test {};
TYPED_TEST_SUITE(LinearNf4, kqlora_test::EnabledSpaces, kqlora_test::SpaceName);

// On every enabled execution space.
TYPED_TEST(LinearNf4, ForwardAndInputGradientMatchFloat64) {
  using E = TypeParam;
  using M = typename E::memory_space;
  // Awkward sizes: 96 outputs, 80 inputs, blocks of 32 (panels need whole blocks), T = 7.
  kqlora::Nf4Layout L;
  L.shape = {96, 80};
  L.block_size = 32;
  L.scaler_block_size = 16;
  const auto Wn = quantize(randn(L.numel(), 1), L);
  const auto W = dequantized(Wn);
  const int64_t T = 7, O = 96, I = 80;
  const auto xf = randn(T * I, 2), gf = randn(T * O, 3);
  auto dW = kqlora::nf4_copy_to<M>(Wn);
  kqlora::LinearNf4Workspace<M> ws;
  ws.max_panel_bytes = 20 * I * 4;  // small panels: several of them, the last one short
  ws.product = kqlora::Nf4Product::panels;
  ASSERT_LT(ws.reserve(O, I, 32, T), O);
  Matrix<M> x = to_matrix<M>(xf, T, I), y("y", T, O), g = to_matrix<M>(gf, T, O), gx("gx", T, I);
  kqlora::linear_nf4_forward(E(), dW, x, y, ws);
  kqlora::linear_nf4_backward(E(), dW, g, gx, ws);
  const auto yv = from_matrix(y), gxv = from_matrix(gx);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < O; ++o) {
      double ref = 0;
      for (int64_t i = 0; i < I; ++i) ref += xf[t * I + i] * W[o * I + i];
      ASSERT_NEAR(yv[t * O + o], ref, 1e-5 * (1 + std::fabs(ref))) << t << "," << o;
    }
    for (int64_t i = 0; i < I; ++i) {
      double ref = 0;
      for (int64_t o = 0; o < O; ++o) ref += gf[t * O + o] * W[o * I + i];
      ASSERT_NEAR(gxv[t * I + i], ref, 1e-5 * (1 + std::fabs(ref))) << t << "," << i;
    }
  }
}

// A bfloat16 NF4 weight times bfloat16 values on bfloat16 hardware (core/gemm_engine.hpp): the
// weight in several 16-bit row panels, the last one short, against float64 on the dequantized
// weight; beta over prior values. Skipped on a CPU without them (host_bf16_products_unit()).
TEST(LinearNf4Bf16Products, SixteenBitPanelsMatchFloat64) {
  if (!kqlora::host_bf16_products())
    GTEST_SKIP() << "no bfloat16 products here (AMX, AMD AVX512_BF16)";
  using H = Kokkos::DefaultHostExecutionSpace;
  using HM = Kokkos::HostSpace;
  kqlora::Nf4Layout L;
  L.shape = {96, 80};
  L.block_size = 32;
  L.scaler_block_size = 16;
  L.dtype = kqlora::DType::bfloat16;
  const auto wf = randn(L.numel(), 21, 0.05f);
  const HostNf4 Wn =
      quantize<kqlora::bfloat16, H>(std::vector<kqlora::bfloat16>(wf.begin(), wf.end()), L);
  const auto W = dequantized(Wn);
  const int64_t T = 9, O = 96, I = 80;
  auto bf16_values = [](std::vector<float> v) {
    for (float& x : v) x = kqlora::round_to_bf16(x);
    return v;
  };
  const auto xf = bf16_values(randn(T * I, 22)), gf = bf16_values(randn(T * O, 23));
  const auto y0 = randn(T * O, 24), gx0 = randn(T * I, 25);
  kqlora::LinearNf4Workspace<HM> ws;
  ws.max_panel_bytes = 20 * I * 2;  // 16 rows of 16 bits: six panels
  ASSERT_LT(ws.reserve16(O, I, 32), O);
  const float beta = 0.5f;
  Matrix<HM> x = to_matrix<HM>(xf, T, I), y = to_matrix<HM>(y0, T, O);
  Matrix<HM> g = to_matrix<HM>(gf, T, O), gx = to_matrix<HM>(gx0, T, I);
  const auto in = kqlora::GemmInputs::bfloat16;
  kqlora::linear_nf4_forward(H(), Wn, x, y, ws, beta, in);
  kqlora::linear_nf4_backward(H(), Wn, g, gx, ws, beta, in);
  ASSERT_EQ(ws.panel.extent(0), 0u) << "the float32 panels were used";
  const auto yv = from_matrix(y), gxv = from_matrix(gx);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < O; ++o) {
      double ref = beta * y0[t * O + o], mag = std::fabs(ref);
      for (int64_t i = 0; i < I; ++i) {
        ref += xf[t * I + i] * W[o * I + i];
        mag += std::fabs(xf[t * I + i] * W[o * I + i]);
      }
      ASSERT_NEAR(yv[t * O + o], ref, 1e-6 * mag) << "y " << t << "," << o;
    }
    for (int64_t i = 0; i < I; ++i) {
      double ref = beta * gx0[t * I + i], mag = std::fabs(ref);
      for (int64_t o = 0; o < O; ++o) {
        ref += gf[t * O + o] * W[o * I + i];
        mag += std::fabs(gf[t * O + o] * W[o * I + i]);
      }
      ASSERT_NEAR(gxv[t * I + i], ref, 1e-6 * mag) << "gx " << t << "," << i;
    }
  }
}

// The fused host kernel (AVX-512 builds) against float64 on the dequantized weights: tile
// edges in every dimension (rows past an 8-row tile and past 512-row blocks, columns past
// a 48-column strip, a summed index past one block -- 640, then blocks of 512 -- in both
// products and not a multiple of the 8 x 8 transposes that pack A), beta 0 / 1 / 0.5 over
// prior values of the output, float32 and bfloat16 NF4, partial scaler blocks.
TEST(LinearNf4Fused, ForwardAndInputGradientMatchFloat64) {
  struct Shape {
    int64_t out, in, block, scaler_block, tokens;
    kqlora::DType dtype;
  };
  const Shape shapes[] = {{70, 320, 64, 256, 1030, kqlora::DType::float32},
                          {48, 272, 16, 3, 15, kqlora::DType::bfloat16},
                          {33, 64, 64, 5, 1, kqlora::DType::float32},
                          {706, 704, 64, 7, 20, kqlora::DType::float32}};
  using H = Kokkos::DefaultHostExecutionSpace;
  using HM = Kokkos::HostSpace;
  for (const Shape& sh : shapes) {
    kqlora::Nf4Layout L;
    L.shape = {sh.out, sh.in};
    L.block_size = sh.block;
    L.scaler_block_size = sh.scaler_block;
    L.dtype = sh.dtype;
    if (!kqlora::impl::nf4_gemm_host_supports(L)) GTEST_SKIP() << "no fused kernel in this build";
    const auto wf = randn(L.numel(), 11, 0.05f);
    HostNf4 Wn;
    if (sh.dtype == kqlora::DType::bfloat16) {
      Wn = quantize<kqlora::bfloat16, H>(std::vector<kqlora::bfloat16>(wf.begin(), wf.end()), L);
    } else {
      Wn = quantize<float, H>(wf, L);
    }
    const auto W = dequantized(Wn);
    const int64_t T = sh.tokens, O = sh.out, I = sh.in;
    const auto xf = randn(T * I, 12), gf = randn(T * O, 13);
    const auto y0 = randn(T * O, 14), gx0 = randn(T * I, 15);
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      kqlora::LinearNf4Workspace<HM> ws;
      ws.product = kqlora::Nf4Product::fused;
      Matrix<HM> x = to_matrix<HM>(xf, T, I), y = to_matrix<HM>(y0, T, O);
      Matrix<HM> g = to_matrix<HM>(gf, T, O), gx = to_matrix<HM>(gx0, T, I);
      kqlora::linear_nf4_forward(H(), Wn, x, y, ws, beta);
      kqlora::linear_nf4_backward(H(), Wn, g, gx, ws, beta);
      // got[t][j] against beta prior[t][j] + sum_k a[t][k] W(j, k), within 1e-6 of the
      // sum of the terms' magnitudes.
      auto expect = [&](const char* what, const std::vector<double>& got,
                        const std::vector<float>& prior, const std::vector<float>& a, int64_t cols,
                        int64_t sum_len, auto&& w_at) {
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t j = 0; j < cols; ++j) {
            double ref = beta * prior[t * cols + j], mag = std::fabs(ref);
            for (int64_t k = 0; k < sum_len; ++k) {
              const double term = double(a[t * sum_len + k]) * w_at(j, k);
              ref += term;
              mag += std::fabs(term);
            }
            ASSERT_NEAR(got[t * cols + j], ref, 1e-6 * (1 + mag)) << what << " " << t << "," << j;
          }
        }
      };
      expect("y", from_matrix(y), y0, xf, O, I, [&](int64_t o, int64_t i) { return W[o * I + i]; });
      expect("gx", from_matrix(gx), gx0, gf, I, O,
             [&](int64_t i, int64_t o) { return W[o * I + i]; });
    }
  }
}

// The fused kernel's side products (an adapter's thin products computed from each packed
// block of A) against float64: x A^T with the forward (V read across A's rows), s gy B and
// s h^T gy with the input gradient (V = B), at ranks 8 and 11 (a partial pass of 8), rows
// past 512-row blocks, summed indices past one block (640, then blocks of 512; 706 = 512 +
// 194 also past the left product's tiles of 4), the left product written and accumulated; and the
// added terms y += s (x A^T) B^T, gx += (s gy B) A in registers.
TEST(LinearNf4Fused, SideProductsMatchFloat64) {
  using H = Kokkos::DefaultHostExecutionSpace;
  using HM = Kokkos::HostSpace;
  if (H().concurrency() != 1) GTEST_SKIP() << "side products run with one host thread only";
  struct Shape {
    int64_t out, in, tokens, rank;
  };
  for (const Shape& sh : {Shape{200, 704, 1030, 8}, Shape{706, 128, 37, 11}}) {
    kqlora::Nf4Layout L;
    L.shape = {sh.out, sh.in};
    L.block_size = 64;
    L.scaler_block_size = 256;
    if (!kqlora::impl::nf4_gemm_host_supports(L)) GTEST_SKIP() << "no fused kernel in this build";
    const HostNf4 Wn = quantize(randn(L.numel(), 31, 0.05f), L);
    const int64_t T = sh.tokens, O = sh.out, I = sh.in, r = sh.rank;
    const float s = 0.75f;
    const auto xf = randn(T * I, 32), gf = randn(T * O, 33), af = randn(r * I, 34);
    const auto bf = randn(O * r, 35), hf = randn(T * r, 36), prior = randn(r * O, 37);
    for (bool accumulate : {false, true}) {
      kqlora::LinearNf4Workspace<HM> ws;
      ws.product = kqlora::Nf4Product::fused;
      Matrix<HM> x = to_matrix<HM>(xf, T, I), y("y", T, O), g = to_matrix<HM>(gf, T, O);
      Matrix<HM> gx("gx", T, I), A = to_matrix<HM>(af, r, I), B = to_matrix<HM>(bf, O, r);
      Matrix<HM> h = to_matrix<HM>(hf, T, r), xa("xa", T, r), gyb("gyb", T, r);
      Matrix<HM> left = to_matrix<HM>(prior, r, O);
      kqlora::Nf4GemmSideProducts fwd;
      fwd.rank = r;
      fwd.right = xa.data();
      fwd.ldr = r;
      fwd.v = A.data();
      fwd.v_stride_k = 1;
      fwd.v_stride_j = I;
      fwd.u = B.data();
      fwd.u_stride_j = 1;
      fwd.u_stride_n = r;
      fwd.u_alpha = s;
      ASSERT_TRUE(
          kqlora::linear_nf4_forward(H(), Wn, x, y, ws, 0.0f, kqlora::GemmInputs::float32, &fwd));
      kqlora::Nf4GemmSideProducts bwd;
      bwd.rank = r;
      bwd.right = gyb.data();
      bwd.ldr = r;
      bwd.v = B.data();
      bwd.v_stride_k = r;
      bwd.v_stride_j = 1;
      bwd.right_alpha = s;
      bwd.left = left.data();
      bwd.ldl = O;
      bwd.h = h.data();
      bwd.ldh = r;
      bwd.left_alpha = s;
      bwd.left_accumulate = accumulate;
      bwd.u = A.data();
      bwd.u_stride_j = I;
      bwd.u_stride_n = 1;
      ASSERT_TRUE(
          kqlora::linear_nf4_backward(H(), Wn, g, gx, ws, 0.0f, kqlora::GemmInputs::float32, &bwd));
      // got[i][j] against base[i][j] + alpha sum_k a(i, k) b(k, j), within 1e-6 of the sum
      // of the terms' magnitudes.
      auto expect = [&](const char* what, const std::vector<double>& got, int64_t rows,
                        int64_t cols, int64_t len, double alpha, auto&& base, auto&& a, auto&& b) {
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            double ref = base(i, j), mag = std::fabs(ref);
            for (int64_t k = 0; k < len; ++k) {
              const double term = alpha * a(i, k) * b(k, j);
              ref += term;
              mag += std::fabs(term);
            }
            ASSERT_NEAR(got[i * cols + j], ref, 1e-6 * (1 + mag)) << what << " " << i << "," << j;
          }
        }
      };
      auto zero = [](int64_t, int64_t) { return 0.0; };
      expect(
          "x A^T", from_matrix(xa), T, r, I, 1.0, zero,
          [&](int64_t t, int64_t k) { return double(xf[t * I + k]); },
          [&](int64_t k, int64_t j) { return double(af[j * I + k]); });
      expect(
          "s g B", from_matrix(gyb), T, r, O, s, zero,
          [&](int64_t t, int64_t k) { return double(gf[t * O + k]); },
          [&](int64_t k, int64_t j) { return double(bf[k * r + j]); });
      // y = x W^T + s (x A^T) B^T and gx = gy W + (s gy B) A in float64 from the rounded
      // side products (their own accuracy is checked above).
      const auto W = dequantized(Wn);
      const auto xa_got = from_matrix(xa), gyb_got = from_matrix(gyb);
      expect(
          "y", from_matrix(y), T, O, I + r, 1.0, zero,
          [&](int64_t t, int64_t k) {
            return k < I ? double(xf[t * I + k]) : xa_got[t * r + k - I];
          },
          [&](int64_t k, int64_t o) {
            return k < I ? W[o * I + k] : s * double(bf[o * r + k - I]);
          });
      expect(
          "gx", from_matrix(gx), T, I, O + r, 1.0, zero,
          [&](int64_t t, int64_t k) {
            return k < O ? double(gf[t * O + k]) : gyb_got[t * r + k - O];
          },
          [&](int64_t k, int64_t i) { return k < O ? W[k * I + i] : double(af[(k - O) * I + i]); });
      expect(
          "s h^T g", from_matrix(left), r, O, T, s,
          [&](int64_t j, int64_t o) { return accumulate ? double(prior[j * O + o]) : 0.0; },
          [&](int64_t j, int64_t t) { return double(hf[t * r + j]); },
          [&](int64_t t, int64_t o) { return double(gf[t * O + o]); });
    }
  }
}

namespace {

struct Case {
  Activation act;
  float dropout;
  bool bias;
  kqlora::LossKind loss;
};

// The model in float64 from the same NF4 weights, parameters and dropout masks.
std::vector<kqlora::ParamEntry> trainable(const kqlora::LoraStack<Exec>& m) {
  std::vector<kqlora::ParamEntry> v;
  for (const auto* e : m.table().of_kind(kqlora::ParamKind::trainable)) v.push_back(*e);
  return v;
}

struct Reference {
  kqlora::ModelConfig cfg;
  std::vector<std::vector<double>> W;    // per layer, [dim, dim] row-major
  std::vector<kqlora::ParamEntry> info;  // the trainable entries

  double loss(const std::vector<double>& p, const std::vector<double>& x,
              const std::vector<double>& target, int64_t T, kqlora::LossKind kind, int64_t step,
              int64_t global_bs) const {
    const int64_t d = cfg.dim, r = cfg.rank;
    const double s = static_cast<double>(cfg.alpha) / r;
    std::vector<double> in = x, out(T * d);
    const int per = cfg.bias ? 3 : 2;
    for (int l = 0; l < cfg.num_layers; ++l) {
      const double* A = p.data() + info[per * l].offset;
      const double* B = p.data() + info[per * l + 1].offset;
      const kqlora::DropoutKey key{cfg.seed,
                                   kqlora::layer_stream(kqlora::RandomStream::dropout, l),
                                   step,
                                   global_bs,
                                   0,
                                   d,
                                   static_cast<float>(cfg.dropout)};
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> xd(d), h(r, 0.0);
        for (int64_t f = 0; f < d; ++f)
          xd[f] = cfg.dropout > 0 ? (key.keep(t, f) ? in[t * d + f] / (1.0 - cfg.dropout) : 0.0)
                                  : in[t * d + f];
        for (int64_t k = 0; k < r; ++k)
          for (int64_t f = 0; f < d; ++f) h[k] += xd[f] * A[k * d + f];
        for (int64_t o = 0; o < d; ++o) {
          double z = 0;
          for (int64_t f = 0; f < d; ++f) z += in[t * d + f] * W[l][o * d + f];
          if (cfg.bias) z += p[info[per * l + 2].offset + o];
          for (int64_t k = 0; k < r; ++k) z += s * h[k] * B[o * r + k];
          out[t * d + o] = l + 1 < cfg.num_layers ? act(cfg.activation, z) : z;
        }
      }
      in = out;
    }
    double L = 0;
    for (int64_t i = 0; i < T * d; ++i)
      L += kind == kqlora::LossKind::sum ? in[i] : (in[i] - target[i]) * (in[i] - target[i]);
    return kind == kqlora::LossKind::sum ? L : L / (T * d);
  }
};

}  // namespace

class LoraStackGradients : public ::testing::TestWithParam<Case> {};

TEST_P(LoraStackGradients, MatchFloat64FiniteDifferences) {
  const Case c = GetParam();
  kqlora::ModelConfig cfg;
  cfg.dim = 16;
  cfg.num_layers = 3;
  cfg.rank = 4;
  cfg.alpha = 8;
  cfg.dropout = c.dropout;
  cfg.bias = c.bias;
  cfg.activation = c.act;
  cfg.block_size = 32;
  cfg.scaler_block_size = 4;
  kqlora::LoraStack<Exec> model(Exec(), cfg);
  Reference ref{cfg, {}, trainable(model)};
  for (int l = 0; l < cfg.num_layers; ++l) {
    kqlora::Nf4Layout L;
    L.shape = {cfg.dim, cfg.dim};
    L.block_size = cfg.block_size;
    L.scaler_block_size = cfg.scaler_block_size;
    const auto w = quantize(randn(L.numel(), 10 + l, 0.5f), L);
    ref.W.push_back(dequantized(w));
    model.nf4[l] = kqlora::nf4_copy_to<Mem>(w);
  }
  const int64_t n = model.num_params(), T = 5, d = cfg.dim;
  const auto pf = randn(n, 20, 0.3f);
  Kokkos::deep_copy(
      model.params,
      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(pf.data(), pf.size()));
  model.params_changed();
  const auto xf = randn(T * d, 21), tf = randn(T * d, 22);
  Matrix<Mem> x = to_matrix(xf, T, d), target = to_matrix(tf, T, d), g("g", T, d);
  Kokkos::deep_copy(model.grads, 0.0f);
  auto y = model.forward(x, /*step=*/3, /*first_sample=*/0, /*global_bs=*/T);
  kqlora::loss_forward_backward(Exec(), c.loss, y, target, double(T * d), g);
  model.backward(g);
  std::vector<float> grads(n);
  Kokkos::deep_copy(
      Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(grads.data(), n),
      model.grads);

  std::vector<double> p(pf.begin(), pf.end()), xd(xf.begin(), xf.end()), td(tf.begin(), tf.end());
  double scale = 0;
  std::vector<double> fd(n);
  for (int64_t i = 0; i < n; ++i) {
    const double h = 1e-5, keep = p[i];
    p[i] = keep + h;
    const double lp = ref.loss(p, xd, td, T, c.loss, 3, T);
    p[i] = keep - h;
    const double lm = ref.loss(p, xd, td, T, c.loss, 3, T);
    p[i] = keep;
    fd[i] = (lp - lm) / (2 * h);
    scale = std::max(scale, std::fabs(fd[i]));
  }
  ASSERT_GT(scale, 0);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(grads[i], fd[i], 2e-4 * scale + 1e-3 * std::fabs(fd[i])) << "parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LoraStackGradients,
    ::testing::Values(Case{Activation::none, 0.0f, false, kqlora::LossKind::sum},
                      Case{Activation::relu, 0.0f, true, kqlora::LossKind::mse},
                      Case{Activation::gelu, 0.25f, true, kqlora::LossKind::sum},
                      Case{Activation::silu, 0.5f, false, kqlora::LossKind::mse},
                      Case{Activation::gelu, 0.0f, false, kqlora::LossKind::mse}));

TEST(LoraStack, MicroBatchesAddUpToTheWholeBatch) {
  kqlora::ModelConfig cfg;
  cfg.dim = 32;
  cfg.num_layers = 2;
  cfg.rank = 8;
  cfg.activation = Activation::silu;
  cfg.block_size = 64;
  cfg.loss = kqlora::LossKind::mse;
  kqlora::LoraStack<Exec> model(Exec(), cfg);
  for (int l = 0; l < 2; ++l) {
    kqlora::Nf4Layout L;
    L.shape = {32, 32};
    model.nf4[l] = kqlora::nf4_copy_to<Mem>(quantize(randn(1024, 30 + l), L));
  }
  const auto pf = randn(model.num_params(), 31, 0.2f);
  Kokkos::deep_copy(
      model.params,
      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(pf.data(), pf.size()));
  const auto xf = randn(8 * 32, 32), tf = randn(8 * 32, 33);
  auto run = [&](std::vector<std::pair<int, int>> parts) {
    Kokkos::deep_copy(model.grads, 0.0f);
    double loss = 0;
    for (auto [r0, rows] : parts) {
      std::vector<float> xs(xf.begin() + r0 * 32, xf.begin() + (r0 + rows) * 32);
      std::vector<float> ts(tf.begin() + r0 * 32, tf.begin() + (r0 + rows) * 32);
      kqlora::Batch<Mem> b{};  // through the model interface: the loss inside the model
      b.inputs = to_matrix(xs, rows, 32);
      b.targets = to_matrix(ts, rows, 32);
      b.first_sample = r0;
      b.global_bs = 8;
      loss += model.forward_backward(b, 8.0 * 32, true);
    }
    std::vector<float> gr(model.num_params());
    Kokkos::deep_copy(
        Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(gr.data(), gr.size()),
        model.grads);
    return std::make_pair(loss, gr);
  };
  const auto whole = run({{0, 8}});
  const auto split = run({{0, 3}, {3, 3}, {6, 2}});
  EXPECT_NEAR(whole.first, split.first, 1e-6 * std::fabs(whole.first));
  for (size_t i = 0; i < whole.second.size(); ++i)
    ASSERT_NEAR(whole.second[i], split.second[i], 1e-5 + 1e-4 * std::fabs(whole.second[i])) << i;
}
