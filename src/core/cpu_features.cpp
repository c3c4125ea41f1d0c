#include "kqlora/core/cpu_features.hpp"

#include <cstdint>
#include <cstring>
#include <sstream>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KQLORA_X86 1
#else
#define KQLORA_X86 0
#endif

namespace kqlora {

namespace {

#if KQLORA_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

// XCR0: which register states the OS saves on a context switch. Read with the raw opcode
// (xgetbv) so no -mxsave flag is needed.
uint64_t xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs v = cpuid(0);
  char vendor[13] = {0};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;
  const unsigned max_leaf = v.a;
  const Regs l1 = cpuid(1);
  const unsigned base_family = (l1.a >> 8) & 0xf, base_model = (l1.a >> 4) & 0xf;
  f.family = int(base_family == 0xf ? base_family + ((l1.a >> 20) & 0xff) : base_family);
  f.model = int(base_family == 0x6 || base_family == 0xf ? base_model | ((l1.a >> 12) & 0xf0)
                                                         : base_model);
  const bool osxsave = (l1.c >> 27) & 1, avx = (l1.c >> 28) & 1;
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool ymm_saved = (xcr & 0x6) == 0x6;    // SSE and AVX state
  const bool zmm_saved = (xcr & 0xe6) == 0xe6;  // + opmask and both zmm halves
  f.fma = avx && ymm_saved && ((l1.c >> 12) & 1);
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7, 0);
    f.avx2 = avx && ymm_saved && ((l7.b >> 5) & 1);
    const bool f512 = (l7.b >> 16) & 1, dq = (l7.b >> 17) & 1, bw = (l7.b >> 30) & 1,
               vl = (l7.b >> 31) & 1;
    f.avx512 = zmm_saved && f512 && dq && bw && vl;
    if (f.avx512 && l7.a >= 1) f.avx512_bf16 = (cpuid(7, 1).a >> 5) & 1;
  }
  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {0};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    f.brand = brand;
    const auto first = f.brand.find_first_not_of(' ');
    const auto last = f.brand.find_last_not_of(' ');
    f.brand = first == std::string::npos ? "" : f.brand.substr(first, last - first + 1);
  }
  return f;
}
#else
CpuFeatures detect() {
  return CpuFeatures{};
}
#endif

}  // namespace

std::string CpuFeatures::describe() const {
  std::ostringstream os;
  os << (brand.empty() ? "unknown CPU" : brand) << " (" << (vendor.empty() ? "?" : vendor)
     << " family " << family << " model " << model << ", ";
  if (avx512) {
    os << "AVX-512" << (avx512_bf16 ? " with BF16" : "");
  } else if (avx2 && fma) {
    os << "AVX2+FMA";
  } else {
    os << "no AVX2/FMA";
  }
  os << ")";
  return os.str();
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace kqlora
