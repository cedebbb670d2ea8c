// The fused CPU attention kernel compiled for AVX2 + FMA + F16C; chosen at run time only on CPUs
// that have them (the rest of the build keeps the baseline ISA, so the binary runs anywhere).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/kernel_types.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
// NOTE: every header is included above the pragma, so only this file's own functions are
// compiled for the wider ISA; the namespace keeps its template instances apart from the others.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2")
namespace pagedattn::cpu {
namespace avx2 {
#define PA_VEC_BYTES 32
#define PA_HAVE_F16C 1
#include "cpu/kernel_body.inc"
#undef PA_HAVE_F16C
#undef PA_VEC_BYTES
}  // namespace avx2
}  // namespace pagedattn::cpu
#pragma GCC pop_options

namespace pagedattn::cpu {
ItemFn select_item_fn_avx2(const KernelParams& p) { return avx2::select_item_fn(p); }
}  // namespace pagedattn::cpu
#else
namespace pagedattn::cpu {
ItemFn select_item_fn_avx2(const KernelParams&) { return nullptr; }
}  // namespace pagedattn::cpu
#endif
