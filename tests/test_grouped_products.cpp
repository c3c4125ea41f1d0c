// The grouped expert products (nn/grouped_expert_products.hpp): every expert's rows times its
// own NF4 or dense matrix in one launch, and the per-expert row sums of the adapters'
// gradients, against float64 products of each expert's dequantized matrix (an expert with
// no rows included, the last tile of rows and columns partial).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kqlora/nn/grouped_expert_products.hpp"
#include "nf4_test_util.hpp"

namespace {

using nf4test::Exec;
using nf4test::Mem;
using Matrix = kqlora::Matrix<Mem>;

Matrix matrix_of(const std::vector<float>& v, int64_t rows, int64_t cols) {
  Matrix m("grouped::m", rows, cols);
  auto h = Kokkos::create_mirror_view(m);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) h(r, c) = v[static_cast<size_t>(r * cols + c)];
  Kokkos::deep_copy(m, h);
  return m;
}

std::vector<float> host_of(const Matrix& m) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  return std::vector<float>(h.data(), h.data() + h.size());
}

const std::vector<int64_t> kOffsets = {0, 5, 5, 23};  // expert 1 chosen by no row
constexpr int64_t kN = 23, kE = 3;

// Y = alpha X W_e^T + beta Y0 (or X W_e) in float64, W_e expert e's [rows, cols] values.
std::vector<double> reference(const std::vector<std::vector<float>>& w, int64_t rows, int64_t cols,
                              bool transposed, const std::vector<float>& x, float alpha,
                              const std::vector<float>& y0, float beta) {
  const int64_t P = transposed ? cols : rows, K = transposed ? rows : cols;
  std::vector<double> y(static_cast<size_t>(kN * P));
  for (int64_t e = 0; e < kE; ++e)
    for (int64_t n = kOffsets[e]; n < kOffsets[e + 1]; ++n)
      for (int64_t p = 0; p < P; ++p) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += double(x[n * K + k]) * w[e][transposed ? k * cols + p : p * cols + k];
        y[n * P + p] = alpha * s + beta * double(y0[n * P + p]);
      }
  return y;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i])));
  EXPECT_LT(worst, 1e-5) << "worst relative error (float32 sums of up to 96 terms)";
}

}  // namespace

// NF4 experts in float32 and bfloat16, both orientations, alpha and beta.
TEST(GroupedExpertProducts, Nf4ProductsEqualEachExpertsOwn) {
  const int64_t rows = 70, cols = 96;  // (70 outputs: a partial tile of 64 columns)
  for (bool bf16 : {false, true}) {
    std::vector<kqlora::Nf4Tensor<Mem>> keep;
    std::vector<std::vector<float>> values;
    for (int64_t e = 0; e < kE; ++e) {
      kqlora::Nf4Layout layout;
      layout.shape = {rows, cols};
      layout.block_size = 32;
      layout.scaler_block_size = 8;
      const auto w = nf4test::randn(rows * cols, 10 + e);
      nf4test::HostNf4 h;
      if (bf16) {
        std::vector<kqlora::bfloat16> b(w.begin(), w.end());
        h = nf4test::quantize(b, layout);
      } else {
        h = nf4test::quantize(w, layout);
      }
      values.push_back(nf4test::dequantize<float>(h));
      keep.push_back(kqlora::nf4_copy_to<Mem>(h));
    }
    std::vector<const kqlora::Nf4Tensor<Mem>*> ptrs;
    for (const auto& t : keep) ptrs.push_back(&t);
    const auto w = kqlora::nf4_expert_matrices(Exec(), ptrs);
    EXPECT_EQ(w.bf16_nf4, bf16);
    for (bool transposed : {false, true}) {
      const int64_t P = transposed ? cols : rows, K = transposed ? rows : cols;
      const auto x = nf4test::randn(kN * K, 3), y0 = nf4test::randn(kN * P, 4);
      for (float beta : {0.0f, 1.0f}) {
        const Matrix X = matrix_of(x, kN, K), Y = matrix_of(y0, kN, P);
        kqlora::grouped_product(Exec(), w, transposed, kOffsets, 0.5f, X, beta, Y);
        SCOPED_TRACE((bf16 ? "bf16 " : "f32 ") + std::string(transposed ? "transposed " : "") +
                     "beta " + std::to_string(beta));
        expect_close(host_of(Y), reference(values, rows, cols, transposed, x, 0.5f, y0, beta));
      }
    }
  }
}

// Dense expert-major slices (an adapter's A [E * r, in]), and the per-expert row sums of
// two grouped matrices into an expert-major gradient (beta keeps an unchosen expert's).
TEST(GroupedExpertProducts, DenseSlicesAndRowSumsEqualEachExpertsOwn) {
  const int64_t r = 7, in = 40;
  const auto a = nf4test::randn(kE * r * in, 5);
  const Matrix A = matrix_of(a, kE * r, in);
  const auto w = kqlora::dense_expert_matrices(Exec(), A, kE);
  std::vector<std::vector<float>> values;
  for (int64_t e = 0; e < kE; ++e)
    values.emplace_back(a.begin() + e * r * in, a.begin() + (e + 1) * r * in);
  const auto x = nf4test::randn(kN * in, 6), y0 = std::vector<float>(kN * r, 0.0f);
  const Matrix X = matrix_of(x, kN, in), H("grouped::h", kN, r);
  kqlora::grouped_product(Exec(), w, false, kOffsets, 1.0f, X, 0.0f, H);
  expect_close(host_of(H), reference(values, r, in, false, x, 1.0f, y0, 0.0f));

  const int64_t P = 9, Q = 70;
  const auto u = nf4test::randn(kN * P, 7), v = nf4test::randn(kN * Q, 8),
             g0 = nf4test::randn(kE * P * Q, 9);
  for (float beta : {0.0f, 1.0f}) {
    const Matrix G = matrix_of(g0, kE * P, Q);
    kqlora::grouped_row_sums(Exec(), kOffsets, 2.0f, matrix_of(u, kN, P), matrix_of(v, kN, Q), beta,
                             kqlora::dense_expert_matrices(Exec(), G, kE));
    std::vector<double> want(g0.size());
    for (int64_t e = 0; e < kE; ++e)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          double s = 0;
          for (int64_t n = kOffsets[e]; n < kOffsets[e + 1]; ++n)
            s += double(u[n * P + p]) * v[n * Q + q];
          want[(e * P + p) * Q + q] = 2.0 * s + beta * g0[(e * P + p) * Q + q];
        }
    SCOPED_TRACE("beta " + std::to_string(beta));
    expect_close(host_of(G), want);
  }
}
