// The device sampler (see sampling_kernels.h for the contract and sample_plan.h for the rules).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "cuda_common.cuh"
#include "pdl.h"  // cluster_attribute
#include "philox.h"
#include "sampling_kernels.h"

namespace pagedattn::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;  // one block per row
constexpr int kCap = 2048;      // candidates a row may keep in shared memory
constexpr int kMaxTop = 20;
constexpr int kRawCap = 512;    // candidates for the top-N log-probabilities
constexpr float kFixedOne = 1099511627776.f;  // 2^40: weight of the most likely token
constexpr int kMaxCluster = 8;  // CTAs a row's two passes may be split over (portable cluster)
constexpr int kClusterSpan = 65536;  // logits a cluster's CTA reads per pass (but past 8 CTAs)
constexpr float kLog2e = 1.4426950408889634f;

// Order-preserving keys: a > b as floats <=> key(a) > key(b); NaN gets 0, below -inf (0x007fffff).
__device__ __forceinline__ uint32_t to_key(float x) {
  if (isnan(x)) return 0u;
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Survivors of a cut: every key above `key`, and the first `n` (in id order) of those equal to it.
struct Cut {
  uint32_t key;
  uint32_t n;
};
constexpr Cut kEverything{0u, 0u};  // all but NaNs

struct Weight {
  bool mass;  // false: each element weighs 1 (counts); true: round(exp((v - m) / t) * 2^40)
  float m, t;
  __device__ __forceinline__ float e(uint32_t k) const {
    return k == 0u ? 0.f : expf((from_key(k) - m) / t);
  }
  __device__ __forceinline__ uint64_t operator()(uint32_t k) const {
    return mass ? uint64_t(__float2ull_rn(e(k) * kFixedOne)) : 1ull;
  }
};

struct Smem {
  uint64_t hist[256];
  uint64_t warp_sum[32];
  uint64_t scan_total;
  uint32_t tk[kThreads];  // per-thread maxima keys (a bound on the top ones)
  uint32_t tk_raw[kThreads];  // the same of the raw row (two-pass path)
  uint32_t ck[kCap];      // candidates: keys and ids, in ascending id order
  int32_t cid[kCap];
  // Candidates as gathered (any order), before the sort by id; after it, a small list's weights
  // in likelihood order (gk as uint64_t[kThreads]) and which of them top-p keeps (gid as bytes).
  alignas(16) uint32_t gk[kCap];
  int32_t gid[kCap];
  uint32_t place[kCap];   // ranks (rank_all)
  uint32_t rk[kRawCap];   // the raw row's top-N candidates (any order)
  int32_t rid[kRawCap];
  uint32_t gathered, gathered_raw;
  uint32_t top_k[kMaxTop];
  int32_t top_id[kMaxTop];
  float red_f[32];
  double red_d[32];
  uint32_t best_key[32];
  int32_t best_id[32];
  uint32_t digit;
  uint64_t above;
  int32_t token;
  bool fail;
  // A split row (cluster of C CTAs): each CTA's log-sum-exp and bounds, in the first CTA's.
  double lse_part[kMaxCluster];
  uint64_t mass_part[kMaxCluster];  // a nucleus row's: each CTA's weight of its share
  uint32_t bound_part[kMaxCluster], raw_part[kMaxCluster];
  float max_part[kMaxCluster];      // a nucleus row's: each CTA's largest edited-row logit
  uint32_t bound_all, raw_all;
  float max_all;
};

// A row in global memory (element i is token i) or the candidate list.
struct RowAcc {
  const float* x;
  __device__ __forceinline__ uint32_t key(int i) const { return to_key(x[i]); }
  __device__ __forceinline__ int32_t id(int i) const { return i; }
};
struct ListAcc {
  const uint32_t* k;
  const int32_t* ids;
  __device__ __forceinline__ uint32_t key(int i) const { return k[i]; }
  __device__ __forceinline__ int32_t id(int i) const { return ids[i]; }
};

// Thread t's contiguous share [lo, hi) of n elements (id-ordered passes).
__device__ __forceinline__ void chunk(int n, int& lo, int& hi) {
  const int c = (n + kThreads - 1) / kThreads;
  lo = min(n, int(threadIdx.x) * c);
  hi = min(n, lo + c);
}

// f(i, x[i]) for every element of a row, the threads striding over 16-byte vectors with
// kUnroll of them in flight each (a scalar loop waits out one memory latency per element). Rows
// start unaligned when vocab % 4 != 0: the scalar head up to the first 16-byte boundary and the
// scalar tail go to the first threads.
constexpr int kUnroll = 4;
template <class F>
__device__ __forceinline__ void for_row(const float* x, int vocab, F&& f) {
  const int misalign = int((reinterpret_cast<uintptr_t>(x) % 16) / 4);
  const int head = min(vocab, (4 - misalign) % 4);
  const int nv = (vocab - head) / 4;
  const int tail = head + 4 * nv;
  const int t = int(threadIdx.x);
  if (t < head) f(t, x[t]);
  const float4* xv = reinterpret_cast<const float4*>(x + head);
  int j = t;
  for (; j + (kUnroll - 1) * kThreads < nv; j += kUnroll * kThreads) {
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = xv[j + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = head + 4 * (j + u * kThreads);
      f(i, v[u].x);
      f(i + 1, v[u].y);
      f(i + 2, v[u].z);
      f(i + 3, v[u].w);
    }
  }
  for (; j < nv; j += kThreads) {
    const float4 v = xv[j];
    const int i = head + 4 * j;
    f(i, v.x);
    f(i + 1, v.y);
    f(i + 2, v.z);
    f(i + 3, v.w);
  }
  if (tail + t < vocab) f(tail + t, x[tail + t]);
}

// Exclusive prefix over the block in thread order; *total gets the sum. Deterministic (integers).
__device__ uint64_t block_exclusive_scan(uint64_t v, uint64_t* total, Smem& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint64_t incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  if (lane == 31) s.warp_sum[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const uint64_t w = s.warp_sum[lane];
    uint64_t wi = w;
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t t = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += t;
    }
    s.warp_sum[lane] = wi - w;
    if (lane == 31) s.scan_total = wi;
  }
  __syncthreads();
  const uint64_t out = incl - v + s.warp_sum[warp];
  *total = s.scan_total;
  __syncthreads();  // warp_sum is reused by the next scan
  return out;
}

// The cut whose survivors' weight first reaches `target`, the heaviest keys first:
// W(key > cut.key) < target <= W(key >= cut.key), cut.n = the fewest of the equal keys that reach
// it. Only `within`'s survivors count (its equal keys as within.n elements). frac > 0: target is
// ceil(frac * the total weight) instead. Returns within when the total is short of the target.
template <class Acc>
__device__ Cut radix_select(const Acc& a, int n, uint64_t target, double frac, Cut within,
                            const Weight& w, Smem& s) {
  uint32_t prefix = 0, mask = 0;
  uint64_t above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) s.hist[i] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += kThreads) {  // uniform over the block
      const int i = base + int(threadIdx.x);
      uint32_t k = 0u;
      bool take = false;
      if (i < n) {
        k = a.key(i);
        take = k > within.key && (k & mask) == prefix;
      }
      const uint32_t d = (k >> shift) & 255u;
      if (!w.mass) {
        // Counts: one atomic per digit per warp (the keys of a row share their leading bytes).
        const unsigned peers = __match_any_sync(0xffffffffu, take ? d : 256u);
        if (take && int(threadIdx.x % 32) == __ffs(int(peers)) - 1)
          atomicAdd(reinterpret_cast<unsigned long long*>(&s.hist[d]),
                    static_cast<unsigned long long>(__popc(peers)));
      } else if (take) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&s.hist[d]),
                  static_cast<unsigned long long>(w(k)));
      }
    }
    if (threadIdx.x == 0 && within.n > 0 && (within.key & mask) == prefix)
      atomicAdd(reinterpret_cast<unsigned long long*>(&s.hist[(within.key >> shift) & 255u]),
                static_cast<unsigned long long>(uint64_t(within.n) * w(within.key)));
    __syncthreads();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      uint64_t local = 0;
      for (int d = 0; d < 8; ++d) local += s.hist[lane * 8 + d];
      uint64_t suffix = local;  // the bins of this lane and every higher one
      for (int o = 1; o < 32; o <<= 1) {
        const uint64_t t = __shfl_down_sync(0xffffffffu, suffix, o);
        if (lane + o < 32) suffix += t;
      }
      if (shift == 24 && frac > 0.0) {
        const uint64_t total = __shfl_sync(0xffffffffu, suffix, 0);
        target = uint64_t(ceil(frac * double(total)));
        if (target == 0) target = 1;
      }
      const unsigned ok = __ballot_sync(0xffffffffu, above + suffix >= target);
      if (ok == 0u) {
        if (lane == 0) s.fail = true;
      } else if (lane == 31 - __clz(int(ok))) {
        uint64_t acc = above + suffix - local;  // the higher lanes' bins
        int d = lane * 8 + 7;
        for (; d > lane * 8; --d) {
          if (acc + s.hist[d] >= target) break;
          acc += s.hist[d];
        }
        s.digit = uint32_t(d);
        s.above = acc;
        s.fail = false;
      }
      if (shift == 24 && frac > 0.0 && lane == 0) s.scan_total = target;
    }
    __syncthreads();
    const bool fail = s.fail;
    if (frac > 0.0 && shift == 24) target = s.scan_total;
    prefix |= s.digit << shift;
    mask |= 255u << shift;
    above = s.above;
    __syncthreads();
    if (fail) return within;
  }
  const uint64_t wk = w(prefix);
  const uint64_t need = target - above;  // > 0, and wk > 0 since the group reaches it
  const uint64_t cnt = wk > 0 ? (need + wk - 1) / wk : 1;
  return Cut{prefix, uint32_t(cnt < 1 ? 1 : cnt)};
}

// Writes the survivors of `cut` (keys and ids, ascending id order) to out_k/out_id when there are
// at most cap of them; returns how many there are.
template <class Acc>
__device__ uint64_t collect(const Acc& a, int n, Cut cut, uint32_t* out_k, int32_t* out_id,
                            int cap, Smem& s) {
  int lo, hi;
  chunk(n, lo, hi);
  uint64_t gt = 0, eq = 0;
#pragma unroll 8
  for (int i = lo; i < hi; ++i) {
    const uint32_t k = a.key(i);
    gt += k > cut.key;
    eq += k == cut.key;
  }
  uint64_t eq_total;
  const uint64_t eq_before = block_exclusive_scan(eq, &eq_total, s);
  const uint64_t left = cut.n > eq_before ? cut.n - eq_before : 0;
  const uint64_t keep_eq = eq < left ? eq : left;
  uint64_t total;
  uint64_t at = block_exclusive_scan(gt + keep_eq, &total, s);
  if (total > uint64_t(cap)) return total;
  uint64_t seen = 0;
#pragma unroll 8
  for (int i = lo; i < hi; ++i) {
    const uint32_t k = a.key(i);
    if (k > cut.key || (k == cut.key && seen++ < keep_eq)) {
      out_k[at] = k;
      out_id[at] = a.id(i);
      ++at;
    }
  }
  __syncthreads();
  return total;
}

// The draw: the survivors of `cut` with e >= min_p, weighted, the first in id order whose
// cumulative weight passes u * total.
template <class Acc>
__device__ int32_t draw(const Acc& a, int n, Cut cut, const Weight& w, float min_p, double u,
                        Smem& s) {
  int lo, hi;
  chunk(n, lo, hi);
  uint64_t eq = 0, mass = 0;
#pragma unroll 8
  for (int i = lo; i < hi; ++i) {
    const uint32_t k = a.key(i);
    if (k > cut.key) {
      if (w.e(k) >= min_p) mass += w(k);
    } else {
      eq += k == cut.key;
    }
  }
  uint64_t eq_total;
  const uint64_t eq_before = block_exclusive_scan(eq, &eq_total, s);
  const uint64_t left = cut.n > eq_before ? cut.n - eq_before : 0;
  const uint64_t keep_eq = eq < left ? eq : left;
  const uint64_t w_eq = w.e(cut.key) >= min_p ? w(cut.key) : 0;
  mass += keep_eq * w_eq;
  uint64_t total;
  const uint64_t before = block_exclusive_scan(mass, &total, s);
  uint64_t target = uint64_t(u * double(total));
  if (target >= total) target = total - 1;
  if (mass > 0 && before <= target && target < before + mass) {
    uint64_t acc = before, seen = 0;
    for (int i = lo; i < hi; ++i) {
      const uint32_t k = a.key(i);
      uint64_t wi = 0;
      if (k > cut.key) {
        wi = w.e(k) >= min_p ? w(k) : 0;
      } else if (k == cut.key && seen < keep_eq) {
        ++seen;
        wi = w_eq;
      }
      acc += wi;
      if (target < acc) {
        s.token = a.id(i);
        break;
      }
    }
  }
  __syncthreads();
  return s.token;
}

// s.place[c] = how many o < n come before c (before(o, c)), for every c < n: a warp per c, its
// lanes splitting the o's (a thread per c would wait out n shared loads in a row).
template <class Before>
__device__ void rank_all(uint32_t n, Before before, Smem& s) {
  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (uint32_t c = warp; c < n; c += kThreads / 32) {
    uint32_t cnt = 0;
    for (uint32_t o = lane; o < n; o += 32) cnt += before(o, c);
    cnt = __reduce_add_sync(0xffffffffu, cnt);
    if (lane == 0) s.place[c] = cnt;
  }
  __syncthreads();
}

// Places the n gathered candidates (s.gk, s.gid) in ascending id order in s.ck, s.cid.
__device__ void sort_gathered_by_id(uint32_t n, Smem& s) {
  rank_all(n, [&](uint32_t o, uint32_t c) { return s.gid[o] < s.gid[c]; }, s);
  for (uint32_t c = threadIdx.x; c < n; c += kThreads) {
    s.ck[s.place[c]] = s.gk[c];
    s.cid[s.place[c]] = s.gid[c];
  }
  __syncthreads();
}

// The elements of the row with key >= lo into s.ck / s.cid in ascending id order, in one pass:
// gathered in any order with a shared counter, then placed by their rank among the ids. Returns
// how many there are (nothing placed when more than kCap).
__device__ uint32_t gather_at_least(const float* x, int vocab, uint32_t lo, Smem& s) {
  if (threadIdx.x == 0) s.gathered = 0u;
  __syncthreads();
  for_row(x, vocab, [&](int i, float v) {
    const uint32_t k = to_key(v);
    if (k < lo) return;
    const uint32_t at = atomicAdd(&s.gathered, 1u);
    if (at < uint32_t(kCap)) {
      s.gk[at] = k;
      s.gid[at] = i;
    }
  });
  __syncthreads();
  const uint32_t n = s.gathered;
  if (n <= uint32_t(kCap)) sort_gathered_by_id(n, s);
  return n;
}

// A cut on `want` elements of the row: through the candidates above the want-th largest of the
// per-thread maxima s.tk when they fit in shared memory, else over the whole row. On return, with
// *in_list, the cut applies to the candidate list (s.ck, s.cid, *list_n).
__device__ Cut top_count(const float* x, int vocab, uint32_t want, bool* in_list, int* list_n,
                         Smem& s) {
  const Weight count{false, 0.f, 1.f};
  *in_list = false;
  if (want <= uint32_t(kThreads)) {
    const Cut bound = radix_select(ListAcc{s.tk, nullptr}, kThreads, want, 0.0, kEverything,
                                   count, s);
    if (bound.key > 0u) {
      const uint32_t n = gather_at_least(x, vocab, bound.key, s);
      if (n <= uint32_t(kCap)) {
        *in_list = true;
        *list_n = int(n);
        return radix_select(ListAcc{s.ck, s.cid}, int(n), want, 0.0, kEverything, count, s);
      }
    }
  }
  return radix_select(RowAcc{x}, vocab, want, 0.0, kEverything, count, s);
}


// Sorts the top list s.top_k / s.top_id (n <= kMaxTop, in id order) most likely first, ties to the
// lower id (thread 0; an insertion sort of at most 20).
__device__ void sort_top(int n, Smem& s) {
  for (int i = 1; i < n; ++i) {
    const uint32_t k = s.top_k[i];
    const int32_t id = s.top_id[i];
    int j = i - 1;
    while (j >= 0 && (s.top_k[j] < k || (s.top_k[j] == k && s.top_id[j] > id))) {
      s.top_k[j + 1] = s.top_k[j];
      s.top_id[j + 1] = s.top_id[j];
      --j;
    }
    s.top_k[j + 1] = k;
    s.top_id[j + 1] = id;
  }
}

// Writes the top list s.top_k / s.top_id (n of them, sorted, most likely first) as ids and
// log-probabilities (thread 0).
__device__ void write_top(int row, int n, double lse, int32_t* top_ids, float* top_logprob,
                          int32_t max_top, const Smem& s) {
  for (int i = 0; i < n; ++i) {
    top_ids[int64_t(row) * max_top + i] = s.top_id[i];
    top_logprob[int64_t(row) * max_top + i] = float(double(from_key(s.top_k[i])) - lse);
  }
}

// An edit of sample_plan.h's step 1 on one logit.
__device__ __forceinline__ float edited(float l, const SampleEdit& ed, const SampleRowDesc& r) {
  if (ed.repeat) l = l > 0.f ? l / r.repetition_penalty : l * r.repetition_penalty;
  l += ed.bias;
  if (ed.count > 0) l -= float(ed.count) * r.frequency_penalty + r.presence_penalty;
  return l;
}

// The block's largest key and the lowest id holding it, from each thread's (bk, bi); ids equal to
// `none` are nothing. Returns the id (none when there is nothing), the key in *key.
__device__ int32_t block_argmax(uint32_t bk, int32_t bi, int32_t none, uint32_t* key, Smem& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  auto fold = [&](uint32_t ok, int32_t oi) {
    if (oi == none) return;
    if (bi == none || ok > bk || (ok == bk && oi < bi)) bk = ok, bi = oi;
  };
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t ok = __shfl_xor_sync(0xffffffffu, bk, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    fold(ok, oi);
  }
  __syncthreads();  // best_key may still be read by a previous call
  if (lane == 0) s.best_key[warp] = bk, s.best_id[warp] = bi;
  __syncthreads();
  bk = s.best_key[lane];
  bi = s.best_id[lane];
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t ok = __shfl_xor_sync(0xffffffffu, bk, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    fold(ok, oi);
  }
  *key = bk;
  return bi;
}

// log(sum(exp(x))) of a row from each thread's running (max tm, sum ts of exp(x - tm)), combined
// in double in a fixed order.
__device__ double block_lse(float tm, float ts, Smem& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float gm = tm;
  for (int o = 16; o > 0; o >>= 1) gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, o));
  __syncthreads();
  if (lane == 0) s.red_f[warp] = gm;
  __syncthreads();
  gm = s.red_f[0];
  for (int w = 1; w < 32; ++w) gm = fmaxf(gm, s.red_f[w]);
  double part = tm == -INFINITY ? 0.0 : double(ts) * exp(double(tm) - double(gm));
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if (lane == 0) s.red_d[warp] = part;
  __syncthreads();
  double sum = 0.0;
  for (int w = 0; w < 32; ++w) sum += s.red_d[w];
  return double(gm) + log(sum);
}

// 2^x by the special function unit (relative error about 2^-22; flushes denormal results to 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The block's largest of each thread's v (NaNs passed over; NaN if all are).
__device__ float block_max(float v, Smem& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) s.red_f[warp] = v;
  __syncthreads();
  float m = s.red_f[0];
  for (int w = 1; w < 32; ++w) m = fmaxf(m, s.red_f[w]);
  return m;
}

// The running (max, sum of exp) of one more value.
__device__ __forceinline__ void lse_add(float v, float& tm, float& ts) {
  if (isnan(v) || v == -INFINITY) return;
  if (v > tm) {
    ts = ts * expf(tm - v) + 1.f;
    tm = v;
  } else {
    ts += expf(v - tm);
  }
}

// The token drawn from the candidate list (s.ck, s.cid, n in id order) after the cut `cut`
// (top-k's, or everything): top-p of what it leaves, min-p, the seeded draw.
__device__ int32_t draw_from_list(int n, Cut cut, float m, const SampleRowDesc& r, Smem& s) {
  const Weight mass{true, m, r.temperature};
  const ListAcc list{s.ck, s.cid};
  if (r.top_p < 1.f) cut = radix_select(list, n, 0, double(r.top_p), cut, mass, s);
  return draw(list, n, cut, mass, r.min_p, philox::uniform(r.seed, r.counter), s);
}

// draw_from_list for a list of n <= kThreads candidates with the top-k cut `want`, one candidate
// per thread and no radix passes: each candidate's rank (larger key first, ties to the lower id)
// gives top-k; a scan of the weights in rank order gives top-p; a scan in id order, the draw.
// row_total > 0 (a nucleus row): top_p is of the whole row's weight, not the list's; returns -1
// when the list's weight falls short of it (its top-p set reaches past the list).
__device__ int32_t draw_from_small_list(int n, uint32_t want, float m, const SampleRowDesc& r,
                                        Smem& s, uint64_t row_total = 0) {
  const Weight mass{true, m, r.temperature};
  uint64_t* by_rank = reinterpret_cast<uint64_t*>(s.gk);  // free once the list is sorted
  uint8_t* kept = reinterpret_cast<uint8_t*>(s.gid);
  const int t = threadIdx.x;
  rank_all(uint32_t(n), [&](uint32_t o, uint32_t c) {
    return s.ck[o] > s.ck[c] || (s.ck[o] == s.ck[c] && s.cid[o] < s.cid[c]);
  }, s);
  uint32_t k = 0u, rank = 0xffffffffu;
  int32_t id = 0;
  uint64_t w = 0;
  if (t < n) {
    k = s.ck[t];
    id = s.cid[t];
    rank = s.place[t];
    if (rank < want) w = mass(k);
  }
  by_rank[t] = 0;
  __syncthreads();
  if (rank < uint32_t(kThreads)) by_rank[rank] = w;
  __syncthreads();
  // Top-p: the smallest prefix (in rank order) whose weight reaches top_p of the survivors'.
  uint64_t total;
  const uint64_t before = block_exclusive_scan(by_rank[t], &total, s);
  uint64_t target = uint64_t(ceil(double(r.top_p) * double(row_total ? row_total : total)));
  if (target == 0) target = 1;
  if (row_total && total < target) return -1;  // the same in every thread
  kept[t] = r.top_p >= 1.f || before < target;
  __syncthreads();
  // The draw, in id order.
  const bool keep = t < n && w > 0 && kept[rank] && mass.e(k) >= r.min_p;
  const uint64_t wk = keep ? w : 0;
  uint64_t sum;
  const uint64_t at = block_exclusive_scan(wk, &sum, s);
  uint64_t pick = uint64_t(philox::uniform(r.seed, r.counter) * double(sum));
  if (pick >= sum) pick = sum - 1;
  if (wk > 0 && at <= pick && pick < at + wk) s.token = id;
  __syncthreads();
  return s.token;
}

// Cluster barriers: arrive (relaxed: nothing to publish yet) and wait, apart, so that the wait
// for every CTA of the cluster to have started costs nothing by the time it is needed.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

// A bound on the want-th largest of the block's keys (each thread's k0 and, with two, k1; key 0
// is nothing): the largest B whose low 16 bits are zero with at least `want` keys >= B, found by
// a binary search on the top 16 bits, each step one counting barrier. 0: fewer than want keys
// above 0. The top 16 bits (sign, exponent, 7 bits of mantissa) make a bound as good as the exact
// k-th largest for a candidate list that fits, at a fraction of a radix select's passes.
__device__ uint32_t count_bound(uint32_t k0, uint32_t k1, bool two, uint32_t want) {
  uint32_t lo = 0u, hi = 0xffffu;  // count(keys >= lo << 16) >= want holds for lo >= 1 once set
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1u) / 2u, b = mid << 16;
    uint32_t c = uint32_t(__syncthreads_count(k0 >= b));
    if (two) c += uint32_t(__syncthreads_count(k1 >= b));
    if (c >= want) lo = mid;
    else hi = mid - 1u;
  }
  return lo << 16;
}

// log(sum(exp(lse_c))) of the C CTAs' log-sum-exps, in rank order (C == 1: lse_0 itself).
__device__ double combine_lse(const double* part, int C) {
  double m = part[0];
  for (int c = 1; c < C; ++c) m = fmax(m, part[c]);
  if (C == 1 || isinf(m)) return m;
  double sum = 0.0;
  for (int c = 0; c < C; ++c) sum += exp(part[c] - m);
  return m + log(sum);
}

// The row's sampling in two passes over the raw logits, never editing them, for top-k rows (and
// greedy ones) with at most kMaxEdits edits. A bitmap in dynamic shared memory (vocab bits, then
// the edited keys) marks the edited tokens. Pass 1 takes the per-thread maxima of the raw row and
// of its unedited logits; the k-th largest of those maxima and the edited logits (to 16 bits,
// count_bound) bounds the edited row's top k (each is a logit of the edited row); pass 2 gathers
// the unedited logits above it (and the raw ones above the N-th largest raw maximum, for the
// top-N log-probabilities), to which the edited logits above it are added, and sums exp(x - max)
// for the log-sum-exp. Returns false, having written nothing, where a bound does not hold or a
// list does not fit.
//
// Split over a cluster of C CTAs (rank 0 .. C - 1), each reads a C-th of the row in both passes:
// each bounds the top k by its own maxima (any bound of a CTA holds for the row; the largest is
// taken), its log-sum-exp goes to rank 0, and pass 2 gathers into rank 0's lists through
// distributed shared memory. Rank 0 alone goes on past pass 2; the return value is only its.
constexpr int kMaxEdits = 1024;
constexpr int kNucleusList = 128;  // a nucleus row's candidates (at least; count_bound's rounding)
static_assert(kMaxEdits <= kThreads, "count_bound takes an edited key a thread");
__device__ bool sample_row_fast(const float* x, int32_t vocab, int row, int rank, int C,
                                bool nucleus, const SampleRowDesc& r, const SampleEdit* edits, int32_t* ids,
                                float* logprob, int32_t* top_ids, float* top_logprob,
                                int32_t max_top, uint32_t* bitmap, Smem& s) {
  const int E = r.edit_end - r.edit_begin;
  // A nucleus row (top-p without top-k): the candidates are the kNucleusList most likely, which
  // hold its top-p set when their weight reaches top_p of the row's (checked below, else false).
  const uint32_t want =
      r.temperature == 0.f ? 1u : nucleus ? uint32_t(min(kNucleusList, vocab)) : uint32_t(r.top_k);
  if (want > uint32_t(kThreads) || E > kMaxEdits) return false;  // the same in every CTA
  if (rank == 0 && threadIdx.x == 0) s.gathered = 0u, s.gathered_raw = 0u;
  if (C > 1) cluster_arrive_relaxed();
  const int words = (vocab + 31) / 32;
  uint32_t* ek = bitmap + words;  // [E] the edited logits' keys
  for (int w = threadIdx.x; w < words; w += kThreads) bitmap[w] = 0u;
  __syncthreads();
  for (int e = int(threadIdx.x); e < E; e += kThreads) {
    const SampleEdit ed = edits[r.edit_begin + e];
    atomicOr(&bitmap[ed.token / 32], 1u << (ed.token % 32));
    ek[e] = to_key(edited(x[ed.token], ed, r));
  }
  __syncthreads();
  // This CTA's share [lo, hi) of the row: whole 16-byte vectors but for the last.
  const int span = (((vocab + C - 1) / C) + 3) / 4 * 4;
  const int lo = min(vocab, rank * span), hi = min(vocab, lo + span);
  const bool lp = r.logprobs >= 0;
  // Pass 1: the thread's largest raw logit and largest unedited one (NaN: none; fmaxf passes
  // NaNs over), the bitmap read only where the latter would grow.
  float fr = NAN, fe = NAN;
  for_row(x + lo, hi - lo, [&](int i, float v) {
    i += lo;
    fr = fmaxf(fr, v);
    const float c = fmaxf(fe, v);
    if (c != fe && !(bitmap[i / 32] & (1u << (i % 32)))) fe = c;
  });
  s.tk[threadIdx.x] = to_key(fe);
  s.tk_raw[threadIdx.x] = to_key(fr);
  float mx = lp ? block_max(fr, s) : 0.f;  // this CTA's largest raw logit, for its sum of exps
  if (mx != mx) mx = -INFINITY;  // nothing but NaNs
  // A nucleus row's largest edited-row logit (this CTA's unedited ones and every edited one),
  // the m of its weights in pass 2.
  float m_row = nucleus ? block_max(fmaxf(fe, int(threadIdx.x) < E ? from_key(ek[threadIdx.x])
                                                                    : NAN), s)
                        : 0.f;
  __syncthreads();
  // The bounds: the maxima's (and edited logits') want-th and n_top-th largest, to 16 bits.
  const Weight count{false, 0.f, 1.f};
  uint32_t bound = count_bound(s.tk[threadIdx.x], threadIdx.x < E ? ek[threadIdx.x] : 0u,
                               E > 0, want);
  const int n_top = lp ? min(min(r.logprobs, max_top), vocab) : 0;
  uint32_t raw_bound = 0u;  // 0: none found (every number)
  if (n_top > 0) raw_bound = count_bound(s.tk_raw[threadIdx.x], 0u, false, uint32_t(n_top));
  cg::cluster_group cluster = cg::this_cluster();
  Smem* lead = &s;
  if (C > 1) {
    lead = cluster.map_shared_rank(&s, 0);
    cluster_wait();  // every CTA has started: its shared memory may be written
    if (threadIdx.x == 0) {
      lead->bound_part[rank] = bound, lead->raw_part[rank] = raw_bound;
      lead->max_part[rank] = m_row;
    }
    cluster.sync();
    if (threadIdx.x == 0) {
      uint32_t b = 0u, rb = 0u;
      float mr = NAN;
      for (int c = 0; c < C; ++c) {
        b = max(b, lead->bound_part[c]), rb = max(rb, lead->raw_part[c]);
        mr = fmaxf(mr, lead->max_part[c]);
      }
      s.bound_all = b, s.raw_all = rb, s.max_all = mr;
    }
    __syncthreads();
    bound = s.bound_all, raw_bound = s.raw_all, m_row = s.max_all;
  }
  if (bound == 0u) {
    if (C > 1) cluster.sync();  // no CTA leaves while another still reads rank 0's
    return false;
  }
  if (n_top > 0 && raw_bound == 0u) raw_bound = 1u;  // every number (the list then overflows)
  if (n_top <= 0) raw_bound = 0xffffffffu;          // nothing gathered
  // Pass 2: the candidates into rank 0's lists, and the sum of exp(x - mx) (NaNs left out).
  uint32_t* gathered = &lead->gathered;
  uint32_t* gathered_raw = &lead->gathered_raw;
  const float shift = isfinite(mx) ? mx * kLog2e : 0.f;
  float ts = 0.f;
  // A nucleus row's weight of the raw logits of this share (sample_plan.h's fixed-point weights;
  // the edited tokens' are swapped for their edited ones below).
  const Weight mass{true, m_row, r.temperature};
  const bool weigh = nucleus && isfinite(m_row);
  uint64_t wsum = 0;
  for_row(x + lo, hi - lo, [&](int i, float v) {
    if (weigh) wsum += mass(to_key(v));
    i += lo;
    const uint32_t k = to_key(v);
    if (k >= bound && !(bitmap[i / 32] & (1u << (i % 32)))) {
      const uint32_t at = atomicAdd(gathered, 1u);
      if (at < uint32_t(kCap)) lead->gk[at] = k, lead->gid[at] = i;
    }
    if (k >= raw_bound) {
      const uint32_t at = atomicAdd(gathered_raw, 1u);
      if (at < uint32_t(kRawCap)) lead->rk[at] = k, lead->rid[at] = i;
    }
    if (lp) ts += v == v ? exp2_approx(fmaf(v, kLog2e, -shift)) : 0.f;
  });
  if (rank == 0) {
    for (int e = int(threadIdx.x); e < E; e += kThreads) {
      if (ek[e] < bound) continue;
      const uint32_t at = atomicAdd(&s.gathered, 1u);
      if (at < uint32_t(kCap)) s.gk[at] = ek[e], s.gid[at] = edits[r.edit_begin + e].token;
    }
  }
  double lse = 0.0;
  if (lp) lse = mx == INFINITY ? double(mx) : block_lse(mx, ts, s);
  uint64_t row_mass = 0;
  if (weigh) {
    if (rank == 0) {  // every edited token weighs its edited logit, not its raw one
      for (int e = int(threadIdx.x); e < E; e += kThreads)
        wsum += mass(ek[e]) - mass(to_key(x[edits[r.edit_begin + e].token]));  // mod 2^64
    }
    block_exclusive_scan(wsum, &row_mass, s);
  }
  if (C > 1) {
    if (threadIdx.x == 0) lead->lse_part[rank] = lse, lead->mass_part[rank] = row_mass;
    cluster.sync();  // the lists are whole (and rank 0's shared memory is read no more)
    if (rank == 0 && lp) lse = combine_lse(s.lse_part, C);
    if (rank == 0) {
      row_mass = 0;
      for (int c = 0; c < C; ++c) row_mass += s.mass_part[c];
    }
  }
  __syncthreads();
  if (rank != 0) return false;
  const uint32_t n = s.gathered;
  if (n > uint32_t(kCap)) return false;
  sort_gathered_by_id(n, s);
  // The edited row's argmax is the list's.
  uint32_t bk = 0u;
  int32_t bi = -1;
  for (uint32_t c = threadIdx.x; c < n; c += kThreads)
    if (bi < 0 || s.ck[c] > bk) bk = s.ck[c], bi = s.cid[c];  // ascending ids: first is lowest
  uint32_t mkey;
  int32_t token = block_argmax(bk, bi, -1, &mkey, s);
  const float m = from_key(mkey);
  if (nucleus && isfinite(m)) {
    // Top-p of the row's weight, cut on the list when the list's weight reaches it.
    if (n > uint32_t(kThreads)) return false;
    token = draw_from_small_list(int(n), n, m, r, s, row_mass);
    if (token < 0) return false;
  } else if (r.temperature > 0.f && isfinite(m)) {
    if (n <= uint32_t(kThreads)) {
      token = draw_from_small_list(int(n), want, m, r, s);
    } else {
      const Cut cut =
          radix_select(ListAcc{s.ck, s.cid}, int(n), want, 0.0, kEverything, count, s);
      token = draw_from_list(int(n), cut, m, r, s);
    }
  }
  if (threadIdx.x == 0) ids[row] = token;
  if (!lp) return true;
  if (threadIdx.x == 0) logprob[row] = float(double(x[token]) - lse);
  if (n_top <= 0) return true;
  const uint32_t nr = s.gathered_raw;
  if (nr > uint32_t(kRawCap)) {
    // Too many raw candidates for the list: the cut over the row, bounded by its maxima.
    bool in_list = false;
    int list_n = 0;
    for (int t = threadIdx.x; t < kThreads; t += kThreads) s.tk[t] = s.tk_raw[t];
    __syncthreads();
    const Cut cut = top_count(x, vocab, uint32_t(n_top), &in_list, &list_n, s);
    const uint64_t got =
        in_list ? collect(ListAcc{s.ck, s.cid}, list_n, cut, s.top_k, s.top_id, kMaxTop, s)
                : collect(RowAcc{x}, vocab, cut, s.top_k, s.top_id, kMaxTop, s);
    if (threadIdx.x == 0) {
      const int nt = int(got < uint64_t(n_top) ? got : uint64_t(n_top));
      sort_top(nt, s);
      write_top(row, nt, lse, top_ids, top_logprob, max_top, s);
    }
    return true;
  }
  // Rank of each raw candidate (larger key first, then lower id): the first n_top are the top.
  rank_all(nr, [&](uint32_t o, uint32_t c) {
    return s.rk[o] > s.rk[c] || (s.rk[o] == s.rk[c] && s.rid[o] < s.rid[c]);
  }, s);
  for (uint32_t c = threadIdx.x; c < nr; c += kThreads) {
    const uint32_t at = s.place[c];
    if (at < uint32_t(n_top)) s.top_k[at] = s.rk[c], s.top_id[at] = s.rid[c];
  }
  __syncthreads();
  if (threadIdx.x == 0)
    write_top(row, min(n_top, int(nr)), lse, top_ids, top_logprob, max_top, s);
  return true;
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(float* __restrict__ logits,  // [rows, vocab]
                       int32_t vocab, const SampleRowDesc* __restrict__ rows,
                       const SampleEdit* __restrict__ edits, float* __restrict__ saved,
                       int32_t* __restrict__ ids, float* __restrict__ logprob,
                       int32_t* __restrict__ top_ids, float* __restrict__ top_logprob,
                       int32_t max_top, int32_t cluster) {
  __shared__ Smem s;
  extern __shared__ uint32_t bitmap[];  // [(vocab + 31) / 32 + kMaxEdits] (two-pass path)
  // grid [rows * cluster]: the cluster's CTAs share a row; only the two-pass path splits it.
  const int row = int(blockIdx.x) / cluster, rank = int(blockIdx.x) % cluster;
  const SampleRowDesc r = rows[row];
  float* x = logits + int64_t(row) * vocab;
  // The two-pass path where it applies (and saves passes: a greedy row with edits or logprobs).
  const bool greedy_with_work =
      r.temperature == 0.f && (r.edit_end > r.edit_begin || r.logprobs >= 0);
  const bool top_k = r.temperature > 0.f && r.top_k > 0 && r.top_k < vocab;
  const bool nucleus = r.temperature > 0.f && !top_k && r.top_p < 1.f;
  if (greedy_with_work || top_k || nucleus) {
    const bool done = sample_row_fast(x, vocab, row, rank, cluster, nucleus, r, edits, ids,
                                      logprob, top_ids, top_logprob, max_top, bitmap, s);
    if (done || rank != 0) return;
  }
  if (rank != 0) return;

  // The general path. 1. The edits in place, each token's original kept to put back.
  for (int e = r.edit_begin + int(threadIdx.x); e < r.edit_end; e += kThreads) {
    const SampleEdit ed = edits[e];
    saved[e] = x[ed.token];
    x[ed.token] = edited(saved[e], ed, r);
  }
  __syncthreads();

  // 2. Per-thread maxima (keys) and the row's argmax (lowest id of the largest key).
  uint32_t bk = 0u;
  int32_t bi = vocab;  // vocab: nothing seen yet
  for_row(x, vocab, [&](int i, float v) {
    const uint32_t k = to_key(v);
    if (bi == vocab || k > bk || (k == bk && i < bi)) bk = k, bi = i;
  });
  s.tk[threadIdx.x] = bk;
  uint32_t max_key;
  int32_t token = block_argmax(bk, bi, vocab, &max_key, s);
  if (token == vocab) token = 0;  // vocab 0
  const float m = x[token];

  // 3. The draw (temperature 0, or a row with no finite maximum: the argmax).
  if (r.temperature > 0.f && isfinite(m)) {
    const Weight mass{true, m, r.temperature};
    bool in_list = false;
    int list_n = 0;
    Cut cut = kEverything;
    bool top_p_done = false;
    if (r.top_k > 0 && r.top_k < vocab) {
      cut = top_count(x, vocab, uint32_t(r.top_k), &in_list, &list_n, s);
    } else if (r.top_p < 1.f) {
      // Top-p alone: the row's total weight, then the candidates above the per-thread maxima
      // whose weight reaches top_p of it (when they do, and fit in shared memory).
      uint64_t part = 0;
      for_row(x, vocab, [&](int, float v) { part += mass(to_key(v)); });
      uint64_t total;
      block_exclusive_scan(part, &total, s);
      uint64_t target = uint64_t(ceil(double(r.top_p) * double(total)));
      if (target == 0) target = 1;
      const Cut bound = radix_select(ListAcc{s.tk, nullptr}, kThreads, target, 0.0, kEverything,
                                     mass, s);
      if (bound.key > 0u) {
        const uint32_t n = gather_at_least(x, vocab, bound.key, s);
        if (n <= uint32_t(kCap)) {
          in_list = true;
          list_n = int(n);
          cut = radix_select(ListAcc{s.ck, s.cid}, list_n, target, 0.0, kEverything, mass, s);
          top_p_done = true;
        }
      }
    }
    if (in_list && !top_p_done) {
      token = draw_from_list(list_n, cut, m, r, s);
    } else if (in_list) {
      token = draw(ListAcc{s.ck, s.cid}, list_n, cut, mass, r.min_p,
                   philox::uniform(r.seed, r.counter), s);
    } else {
      const RowAcc row{x};
      if (r.top_p < 1.f && !top_p_done)
        cut = radix_select(row, vocab, 0, double(r.top_p), cut, mass, s);
      token = draw(row, vocab, cut, mass, r.min_p, philox::uniform(r.seed, r.counter), s);
    }
  }

  // 4. The row as the model gave it, for the log-probabilities.
  for (int e = r.edit_begin + int(threadIdx.x); e < r.edit_end; e += kThreads)
    x[edits[e].token] = saved[e];
  __syncthreads();
  if (threadIdx.x == 0) ids[row] = token;
  if (r.logprobs < 0) return;

  // log-sum-exp and the per-thread maxima of the raw row.
  float tm = -INFINITY, ts = 0.f;
  uint32_t tkey = 0u;
  for_row(x, vocab, [&](int, float v) {
    const uint32_t k = to_key(v);
    tkey = k > tkey ? k : tkey;
    lse_add(v, tm, ts);
  });
  s.tk[threadIdx.x] = tkey;
  const double lse = block_lse(tm, ts, s);
  if (threadIdx.x == 0) logprob[row] = float(double(x[token]) - lse);
  const int n_top = min(min(r.logprobs, max_top), vocab);
  if (n_top <= 0) return;

  bool in_list = false;
  int list_n = 0;
  const Cut cut = top_count(x, vocab, uint32_t(n_top), &in_list, &list_n, s);
  const uint64_t got =
      in_list ? collect(ListAcc{s.ck, s.cid}, list_n, cut, s.top_k, s.top_id, kMaxTop, s)
              : collect(RowAcc{x}, vocab, cut, s.top_k, s.top_id, kMaxTop, s);
  if (threadIdx.x != 0) return;
  const int n = int(got < uint64_t(n_top) ? got : uint64_t(n_top));
  sort_top(n, s);  // collect wrote them in id order
  write_top(row, n, lse, top_ids, top_logprob, max_top, s);
}

}  // namespace

int32_t sample_cluster_size(int32_t vocab) {
  return std::clamp((vocab + kClusterSpan - 1) / kClusterSpan, 1, kMaxCluster);
}

void sample_rows(float* logits, int32_t rows, int32_t vocab, const SampleRowDesc* row_desc,
                 const SampleEdit* edits, float* saved, int32_t* ids, float* logprob,
                 int32_t* top_ids, float* top_logprob, int32_t max_top, cudaStream_t stream,
                 int32_t cluster) {
  if (rows <= 0) return;
  if (cluster <= 0) cluster = sample_cluster_size(vocab);
  if (cluster > kMaxCluster) fail("sample_rows: a cluster of ", cluster, " CTAs is too large");
  const size_t dynamic = (size_t((vocab + 31) / 32) + kMaxEdits) * sizeof(uint32_t);
  const size_t limit = 227 * 1024 - sizeof(Smem);
  if (dynamic > limit) fail("sample_rows: a vocabulary of ", vocab, " is too large");
  // NOTE: set each call (cheap): the attribute is per device, and a process may use several.
  check_cuda(cudaFuncSetAttribute(sample_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(dynamic)),
             "sample_rows");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(rows) * unsigned(cluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = dynamic;
  cfg.stream = stream;
  cudaLaunchAttribute at[1] = {cluster_attribute(unsigned(cluster))};
  cfg.attrs = at;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, sample_rows_kernel, logits, vocab, row_desc, edits, saved,
                                ids, logprob, top_ids, top_logprob, max_top, cluster),
             "sample_rows");
  check_launch("sample_rows");
}

}  // namespace pagedattn::cuda
