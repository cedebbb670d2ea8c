// Device helpers shared by the CUDA attention kernels: error checks, element tags with 16-byte
// vector conversions, and the online-softmax state merge used by every kernel and the merge pass.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

namespace pagedattn::cuda {

// Throws Error("<what>: <CUDA message>") unless e is cudaSuccess.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, ": ", cudaGetErrorString(e));
}
// After every launch: a bad configuration surfaces here, not at the next synchronising call.
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

// Raises a kernel's dynamic shared memory limit to `bytes` on the current device, once per device
// (the attribute is per device: a process driving several GPUs sets it on each). `done` is the
// caller's static bit set of devices already configured.
template <class K>
void set_smem_limit_on_this_device(K kernel, int bytes, std::atomic<uint64_t>& done,
                                   const char* what) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), what);
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (bit && (done.load() & bit)) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             what);
  done.fetch_or(bit);
}

// ---- element tags: storage width and 16-byte vector -> float conversion (exact) ----
struct Bf16 {
  static constexpr int kBytes = 2;
  static constexpr DType kDType = DType::bf16;
  static __device__ __forceinline__ void word_to_float(uint32_t w, float* f) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
  }
  static __device__ __forceinline__ uint16_t from_float(float x) { return f32_to_bf16(x); }
};
struct F16 {
  static constexpr int kBytes = 2;
  static constexpr DType kDType = DType::f16;
  static __device__ __forceinline__ void word_to_float(uint32_t w, float* f) {
    __half2 h;
    memcpy(&h, &w, 4);
    const float2 r = __half22float2(h);
    f[0] = r.x;
    f[1] = r.y;
  }
  static __device__ __forceinline__ uint16_t from_float(float x) { return f32_to_f16(x); }
};
// Four e4m3 values (a word) -> four f16 values (exact): bytes 0-1 into lo, 2-3 into hi. Written in
// PTX so that the upper pair is read as the register's high half (no shift before the conversion).
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

struct Fp8 {
  static constexpr int kBytes = 1;
  static constexpr DType kDType = DType::fp8_e4m3;
  // Four e4m3 values of one word -> floats (through f16, which holds every e4m3 value exactly).
  static __device__ __forceinline__ void word_to_float(uint32_t w, float* f) {
    uint32_t p[2];
    e4m3x4_to_f16x4(w, p[0], p[1]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      __half2 h;
      memcpy(&h, &p[j], 4);
      const float2 x = __half22float2(h);
      f[2 * j] = x.x;
      f[2 * j + 1] = x.y;
    }
  }
};

// Elements of T in one 16-byte vector.
template <class T>
constexpr int kVecElems = 16 / T::kBytes;

// 16 bytes -> kVecElems<T> floats.
template <class T>
__device__ __forceinline__ void vec_to_float(const uint4& r, float* f) {
  constexpr int kPerWord = 4 / T::kBytes;
  T::word_to_float(r.x, f);
  T::word_to_float(r.y, f + kPerWord);
  T::word_to_float(r.z, f + 2 * kPerWord);
  T::word_to_float(r.w, f + 3 * kPerWord);
}

// Read-only 16-byte load through the non-coherent path.
__device__ __forceinline__ uint4 ldg16(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

// ---- programmatic dependent launch ----
// Lets the kernel queued after this one, when it is launched with programmatic stream serialization
// (the model's skinny GEMM), start its CTAs now: they prefetch what does not depend on this kernel
// and wait (griddepcontrol.wait) for its completion before reading anything it writes. Without
// such a follower it does nothing.
__device__ __forceinline__ void allow_dependent_launch() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
// The other side (pdl.h): a kernel launched with programmatic stream serialization waits here,
// before touching memory, until the kernels before it have finished and their writes are visible.
// A plainly launched kernel passes at once.
__device__ __forceinline__ void wait_for_dependency() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// ---- cp.async: 16-byte global -> shared copies completing in commit groups ----
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- online softmax state (log2 domain: m is the running max of logit * log2(e)) ----
// NOTE: every kernel and the merge pass combine states with these functions and explicit
// round-to-nearest intrinsics (no contraction into FMA), so a row gives bit-identical results
// whether its chunks are merged inside one CTA or by the split-KV merge pass.
struct SoftmaxState {
  float m, d, acc;
};
__device__ __forceinline__ void merge_state(SoftmaxState& run, float cm, float cd, float ca) {
  const float mn = fmaxf(run.m, cm);
  if (mn == -INFINITY) return;
  const float wr = exp2f(run.m - mn), wc = exp2f(cm - mn);
  run.acc = __fadd_rn(__fmul_rn(run.acc, wr), __fmul_rn(ca, wc));
  run.d = __fadd_rn(__fmul_rn(run.d, wr), __fmul_rn(cd, wc));
  run.m = mn;
}
// The output element of a finished state (0 when the query saw no key); v_scale for fp8 pools.
__device__ __forceinline__ float finalize_state(const SoftmaxState& s, float v_scale) {
  return s.d > 0.f ? __fmul_rn(__fdiv_rn(s.acc, s.d), v_scale) : 0.f;
}

// A chunk's state from the N partial states of its warps (or thread groups) at m[r * stride],
// d[r * stride]: its max (cm) and sum (cd), and each partial's weight, handed to store(r, w) in
// order (the weighted sum of their outputs is the caller's).
template <int N, class Store>
__device__ __forceinline__ void weigh_states(const float* m, const float* d, int stride,
                                             Store&& store, float& cm, float& cd) {
  float mx = -INFINITY;
#pragma unroll
  for (int r = 0; r < N; ++r) mx = fmaxf(mx, m[r * stride]);
  float den = 0.f;
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const float mr = m[r * stride];
    const float w = mr == -INFINITY ? 0.f : exp2f(mr - mx);
    store(r, w);
    den = fmaf(d[r * stride], w, den);
  }
  cm = mx;
  cd = den;
}

constexpr float kLog2e = 1.4426950408889634f;

}  // namespace pagedattn::cuda
