// The x16 kernels of quant_kernels.h for x86, compiled three times from quant_dot_x86.inc, each
// chosen at run time only on CPUs that have its extensions (quant_matmul.cpp):
//   avx2        AVX2 + FMA + F16C, byte products with pmaddubsw + pmaddwd, 4 activation rows a pass
//   avxvnni     the same with AVX-VNNI's 256-bit byte dot products (vpdpbusd)
//   avx512vnni  AVX-512 (F, BW) with VNNI's 512-bit byte dot products: a group's 16 rows in one
//               register, 8 activation rows a pass in its 32 registers
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "pagedattn/gguf.h"
#include "quant_kernels.h"

// NOTE: clang does not take `#pragma GCC target` (the fuzzing build compiles with it): there the
// portable kernels run, as in the CPU attention kernel.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>

// NOTE: every header is included above the pragmas, so only the kernels are compiled for the
// wider ISAs and the binary still runs on any x86-64.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define PA_QK_NAME avx2
#define PA_QK_ROWS 4
#define PA_QK_ZMM 0
#define PA_QK_VNNI 0
#include "quant_dot_x86.inc"
#undef PA_QK_VNNI
#undef PA_QK_ZMM
#undef PA_QK_ROWS
#undef PA_QK_NAME
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#define PA_QK_NAME avxvnni
#define PA_QK_ROWS 4
#define PA_QK_ZMM 0
#define PA_QK_VNNI 1
#define PA_QK_DPBUSD _mm256_dpbusd_avx_epi32
#include "quant_dot_x86.inc"
#undef PA_QK_DPBUSD
#undef PA_QK_VNNI
#undef PA_QK_ZMM
#undef PA_QK_ROWS
#undef PA_QK_NAME
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define PA_QK_NAME avx512vnni
#define PA_QK_ROWS 8
#define PA_QK_ZMM 1
#define PA_QK_VNNI 1
#define PA_QK_DPBUSD _mm256_dpbusd_epi32
#include "quant_dot_x86.inc"
#undef PA_QK_DPBUSD
#undef PA_QK_VNNI
#undef PA_QK_ZMM
#undef PA_QK_ROWS
#undef PA_QK_NAME
#pragma GCC pop_options

namespace pagedattn::cpu::qk {
const Kernels* avx2_kernels() { return &avx2::table(); }
const Kernels* avxvnni_kernels() { return &avxvnni::table(); }
const Kernels* avx512vnni_kernels() { return &avx512vnni::table(); }
}  // namespace pagedattn::cpu::qk

#else
namespace pagedattn::cpu::qk {
const Kernels* avx2_kernels() { return nullptr; }
const Kernels* avxvnni_kernels() { return nullptr; }
const Kernels* avx512vnni_kernels() { return nullptr; }
}  // namespace pagedattn::cpu::qk
#endif
