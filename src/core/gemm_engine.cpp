#include "kqlora/core/gemm_engine.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <sstream>

#include "kqlora/build_config.hpp"
#include "kqlora/core/blas_selection.hpp"
#include "kqlora/core/error.hpp"

#if KQLORA_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

namespace kqlora {

namespace {

std::atomic<GemmEngine> engine{KQLORA_HAVE_ONEDNN ? GemmEngine::onednn : GemmEngine::blas};
std::string engine_note = "KQLORA_GEMM unset";  // written once during start-up
std::atomic<bool> bf16_wanted{true};            // KQLORA_AMX, set_host_bf16_products
std::string bf16_note = "KQLORA_AMX unset";     // written once during start-up

const char* name(GemmEngine e) {
  return e == GemmEngine::onednn ? "oneDNN" : "BLAS";
}

}  // namespace

GemmEngine host_gemm_engine() {
  return engine.load(std::memory_order_relaxed);
}

bool onednn_available() {
  return KQLORA_HAVE_ONEDNN != 0;
}

void set_host_gemm_engine(GemmEngine e) {
  KQLORA_CHECK(e != GemmEngine::onednn || onednn_available(),
               "this kqlora was built without oneDNN");
  engine.store(e, std::memory_order_relaxed);
}

bool host_bf16_products() {
  return bf16_wanted.load(std::memory_order_relaxed) && host_gemm_engine() == GemmEngine::onednn &&
         host_bf16_products_available();
}

void set_host_bf16_products(bool on) {
  KQLORA_CHECK(!on || host_bf16_products_available(),
               "bfloat16 products: not available here (oneDNN on a CPU with AMX, or an AMD "
               "CPU with AVX512_BF16)");
  bf16_wanted.store(on, std::memory_order_relaxed);
}

namespace {
void select_amx() {
  const char* v = std::getenv("KQLORA_AMX");
  if (!v || !*v) return;
  const std::string s(v);
  if (s == "off") {
    bf16_wanted.store(false, std::memory_order_relaxed);
  } else if (s != "on") {
    throw InputError("KQLORA_AMX=" + s + ": expected on or off");
  }
  // (on: where available; a machine without bfloat16 hardware runs the deck in float32)
  bf16_note = "KQLORA_AMX=" + s;
}
}  // namespace

void select_gemm_engine() {
  select_amx();
  const char* v = std::getenv("KQLORA_GEMM");
  if (!v || !*v) return;
  const std::string s(v);
  if (s == "blas") {
    set_host_gemm_engine(GemmEngine::blas);
  } else if (s == "onednn") {
    if (!onednn_available())
      throw InputError(
          "KQLORA_GEMM=onednn: this kqlora was built without oneDNN "
          "(configure with oneDNN installed, e.g. Debian's libdnnl-dev)");
    set_host_gemm_engine(GemmEngine::onednn);
  } else {
    throw InputError("KQLORA_GEMM=" + s + ": expected blas or onednn");
  }
  engine_note = "KQLORA_GEMM=" + s;
}

std::string describe_gemm_engine() {
  std::ostringstream os;
  const GemmEngine e = host_gemm_engine();
  os << name(e);
#if KQLORA_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  if (e == GemmEngine::onednn)
    os << " " << v->major << "." << v->minor << "." << v->patch << " (as many threads as the BLAS)";
  else
    os << " (oneDNN " << v->major << "." << v->minor << "." << v->patch << " built in, not used)";
#else
  os << " (built without oneDNN)";
#endif
  os << "; " << engine_note << "; bfloat16 products: "
     << (host_bf16_products()      ? host_bf16_products_unit() + " (oneDNN, summed in float32)"
         : e != GemmEngine::onednn ? std::string("float32 (the BLAS engine)")
         : host_bf16_products_available() ? "float32 (" + host_bf16_products_unit() + " turned off)"
                                          : std::string("float32 (no AMX or AMD AVX512_BF16 here)"))
     << ", " << bf16_note;
  return os.str();
}

namespace impl {

#if KQLORA_HAVE_ONEDNN
namespace {
// oneDNN's OpenMP runtime takes its thread count from the OpenMP ICV of the calling thread;
// it is set around each call so that neither a Kokkos OpenMP pool nor the user's
// OMP_NUM_THREADS sizes it differently from the BLAS (looked up: libgomp comes with
// oneDNN, and kqlora itself does not link OpenMP).
using GetThreads = int (*)();
using SetThreads = void (*)(int);
struct OmpThreads {
  GetThreads get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  SetThreads set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  GetThreads blas = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  int wanted() const { return blas ? std::max(1, blas()) : blas_threads(); }
};
const OmpThreads& omp_threads() {
  static const OmpThreads t;
  return t;
}
}  // namespace

OnednnThreads::OnednnThreads() {
  const OmpThreads& omp = omp_threads();
  const int want = omp.wanted();
  had_ = omp.get && omp.set ? omp.get() : want;
  if (had_ != want)
    omp.set(want);
  else
    had_ = 0;
}

OnednnThreads::~OnednnThreads() {
  if (had_ > 0) omp_threads().set(had_);
}
#else
OnednnThreads::OnednnThreads() {}
OnednnThreads::~OnednnThreads() {}
#endif

void onednn_sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
#if KQLORA_HAVE_ONEDNN
  const OnednnThreads threads;
  const dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  KQLORA_CHECK(st == dnnl_success, "dnnl_sgemm(" << ta << ", " << tb << ", " << m << ", " << n
                                                 << ", " << k << ") failed: status " << st);
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)A, (void)lda, (void)B,
      (void)ldb, (void)beta, (void)C, (void)ldc;
  KQLORA_CHECK(false, "onednn_sgemm: this kqlora was built without oneDNN");
#endif
}

}  // namespace impl
}  // namespace kqlora
