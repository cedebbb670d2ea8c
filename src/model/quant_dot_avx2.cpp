// The x8 kernels (quant_dot_x86.inc) for AVX2 + FMA + F16C (pmaddubsw byte products), chosen at
// run time only on CPUs that have them (quant_matmul.cpp).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant_kernels.h"

// NOTE: clang does not take `#pragma GCC target` (the fuzzing build compiles with it): there the
// portable kernels run, as in the CPU attention kernel.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>

// NOTE: every header is included above the pragma, so only this file's own functions are compiled
// for the wider ISA and the binary still runs on any x86-64.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define PA_X8_NAME avx2
#define PA_X8_ROWS 4
#define PA_X8_VNNI 0
#include "quant_dot_x86.inc"
#pragma GCC pop_options

namespace pagedattn::cpu::qk {
const Kernels* avx2_kernels() { return &avx2::table(); }
}  // namespace pagedattn::cpu::qk

#else
namespace pagedattn::cpu::qk {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace pagedattn::cpu::qk
#endif
