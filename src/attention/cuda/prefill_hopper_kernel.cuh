// The Hopper paged prefill kernel (sm_90a): wgmma on shared-memory tiles brought in by the Tensor
// Memory Accelerator, a producer warp and two consumer warpgroups synchronised by mbarriers.
//
// Works: a prefill item (sequence, first packed row; the same items as prefill_kernel.cuh) for
// one KV head, in the order described at hopper_work (heaviest first across the heads of an
// L2-sized section). Grid: one CTA per SM (AttentionParams::hopper_ctas), each running its works
// one after the other (hopper_next_work), or one CTA per work. Block: 3 warpgroups (384 threads).
//   warpgroup 0 (producer): a work's Q by a bulk tensor copy, then for each KV tile of kBN
//     positions its K and V, page by page through the block table, into kStages shared-memory
//     stages; each stage has a full barrier and an empty barrier (the consumers' arrivals). Three
//     ways:
//     - tensor copies (GATHER false, wherever the page size allows them): warp 0 (Q and K) and
//       warp 1 (V) issue one bulk tensor copy per page-sized run of rows and column block (one
//       tensor map over the pool: coordinates (dim, slot, kv head, page id)); the full barriers
//       count the transaction bytes;
//     - gathered (GATHER true: pages that are not a multiple of 8 tokens, which no tensor copy
//       takes, or CudaPlanOptions::hopper_gather): the warpgroup's 128 threads copy 16-byte
//       chunks with cp.async into the same swizzled layout (produce_gather below); slots past
//       kv_len are zero-filled by the copy itself, and each thread's copies of a tile arrive on
//       its full barrier as they land (cp.async.mbarrier.arrive), so the full barriers count 128
//       arrivals.
//       NOTE: measured on an H100 at page 16 (batch 1, length 8192, d128): 428 TFLOP/s gathered,
//       387 with V alone gathered, 527 by tensor copies: the producer threads' instructions take
//       issue slots from the consumers.
//     - fp8 pools (FP8 true): bulk tensor copies of the e4m3 rows into staging tiles, which
//       warps 0-1 (K) and 2-3 (V) convert to f16 into the stages (the products then run in f16;
//       a bf16 Q is converted to f16 in shared memory by the consumers); each side meets at a
//       barrier once its tile is converted, and one lane then arrives on the stage's full barrier.
//   warpgroups 1 and 2 (consumers): 64 packed rows each (packed row r = query r / group, head
//     r % group of this KV head, so a K/V tile serves the whole GQA group); S = Q K^T by wgmma
//     m64nBNk16 from shared memory, the online softmax in fp32 registers, O += P V by wgmma with P
//     from registers and V read N-major from shared memory; with ping-pong (the default) the two
//     take turns at issuing their products, so that one's softmax runs under the other's.
// KV tiles above a warpgroup's causal diagonal (or before its window) are skipped, and masks are
// applied only to tiles that cross a boundary. Cache slots past kv_len (never written; they may
// hold NaN) are zeroed in the V stage by the producer before the consumers read it.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <type_traits>

#include "cuda_common.cuh"
#include "hopper.cuh"
#include "kernels.h"
#include "mma.cuh"
#include "wgmma_ops.cuh"

namespace pagedattn::cuda {

constexpr int kHopperThreads = 384;
// How far (log2 units) a tile's row maximum may pass the running one before the online softmax
// moves it (and rescales O), from head dim 128: probabilities then reach 2^8 at most, which P's
// 16-bit types and the fp32 sums hold with their usual relative precision.
// NOTE: measured on an H100 (two builds alternating, batch 1 / 4 x 2048-32768): head dim 256
// 1.6-3.3% faster (fp8 K/V 1-4%), 128 level for bf16 and 2-6% faster for fp8, 64 3-5.5% slower
// (its O is 32 registers a thread: the rescale costs less than the branch), so 64 rescales always.
constexpr float kLazyMax = 8.f;

template <int HEAD_DIM, bool FP8 = false>
struct HopperShape {
  static constexpr int kBM = kPrefillRows;  // two consumer warpgroups of 64 rows
  static constexpr int kBN = HEAD_DIM >= 256 ? 64 : 128;
  // NOTE: measured on an H100 (Nsight Compute, batch 1, length 8192, d128, page 16): with two
  // stages the consumers spent 11% of their samples waiting for K; three fit up to d128
  // (226 KiB of the 227 KiB a block may have). fp8 pools need room for their staging tiles.
  static constexpr int kStages = HEAD_DIM <= (FP8 ? 64 : 128) ? 3 : 2;
  static constexpr int kBlocks = HEAD_DIM / 64;  // 128-byte column blocks of a row
  static constexpr uint32_t kQBytes = kBM * HEAD_DIM * 2;
  static constexpr uint32_t kTileBytes = kBN * HEAD_DIM * 2;  // one K or V tile (16-bit)
  // fp8: K and V tiles as the pool stores them (e4m3), before their conversion; two of each
  // (the next tile's copy in flight while one is converted) where they fit.
  static constexpr uint32_t kStagingBytes = FP8 ? kBN * HEAD_DIM : 0;
  static constexpr size_t kBaseBytes = 2048 + kQBytes + size_t(2) * kStages * kTileBytes;
  static constexpr int kStagingBufs = kBaseBytes + size_t(4) * kStagingBytes <= 232448 ? 2 : 1;
  // 1024 bytes of alignment slack, 1024 of barriers, Q, the K and V stages, the staging tiles.
  static constexpr size_t kSmemBytes = kBaseBytes + size_t(2) * kStagingBufs * kStagingBytes;
  // Registers a thread (the launch's 168 x 384 shared out): fp8 pools' producers convert, and in
  // the serial loop, whose consumers need fewer, they take 56 (with 40, their state across tiles
  // spilled); the overlapped loop's consumers need 232.
  template <bool OVERLAP>
  static constexpr int kProducerRegs = FP8 && !OVERLAP ? 56 : 40;
  template <bool OVERLAP>
  static constexpr int kConsumerRegs = FP8 && !OVERLAP ? 224 : 232;
  // NOTE: the split must fit the 168 x 384 registers the launch holds: the consumers' setmaxnreg
  // waits until the producer's has given back what they take, so a split past it never starts
  // (seen on an H100: 48 for the producer with 232 for the consumers hung the first launch).
  template <bool OVERLAP>
  static constexpr bool kRegsFit =
      kProducerRegs<OVERLAP> * 128 + kConsumerRegs<OVERLAP> * 256 <= 168 * 384;
  static_assert(kRegsFit<true> && kRegsFit<false>, "the register split fits the launch's");
  static_assert(kBM == 128, "two consumer warpgroups of 64 rows");
  static_assert(kSmemBytes <= 232448, "fits the 227 KiB a block may have");
};

// Eight e4m3 values -> eight f16 values (exact: e4m3 has 3 mantissa bits and a narrower range).
__device__ __forceinline__ uint4 e4m3x8_to_f16(uint2 in) {
  uint4 out;
  e4m3x4_to_f16x4(in.x, out.x, out.y);
  e4m3x4_to_f16x4(in.y, out.z, out.w);
  return out;
}

// The gathering producer (GATHER) of one work: the 128 threads of warpgroup 0 copy each K and V
// tile of BN rows x HEAD_DIM into its stage [NB][BN][64], swizzled as a 128-byte-swizzle tensor
// copy would write it (16-byte chunk c of row r at c ^ (r % 8)); tile i goes to the ring's
// position base + i (the tiles of the CTA's works before).
//
// Thread mapping (CPR = HEAD_DIM / 8 chunks per row): a thread copies chunk pt % CPR of rows
// rg, rg + RG, rg + 2 RG, ... (rg = pt / CPR, RG = 128 / CPR row groups), so one warp instruction
// covers 32 / CPR whole row segments (coalesced 256-byte reads at d128). A warp's rows are 32
// (16 at d256); lane l reads the page of its l-th row once per tile and the lanes that copy that
// row take it by a shuffle.
template <int HEAD_DIM>
__device__ __forceinline__ void produce_gather(const AttentionParams& p, int seq, int kvh,
                                               int t_first, int ntiles, int L, int base,
                                               uint16_t* sK, uint16_t* sV, uint64_t* k_full,
                                               uint64_t* v_full, uint64_t* k_empty,
                                               uint64_t* v_empty) {
  using S = HopperShape<HEAD_DIM>;
  constexpr int BN = S::kBN, ST = S::kStages;
  constexpr int CPR = HEAD_DIM / 8;    // 16-byte chunks per row: 8, 16, 32
  constexpr int RPW = 32 / CPR;        // row groups per warp: 4, 2, 1
  constexpr int RG = 128 / CPR;        // row groups: 16, 8, 4
  constexpr int NJ = BN / RG;          // rows per thread and tile: 8, 16, 16
  static_assert(RPW * NJ <= 32, "a warp's rows of a tile fit its lanes");
  // NOTE: not fully unrolled: the producer has 40 registers, and every row's address computed
  // ahead spilled.
  constexpr int kUnroll = HEAD_DIM >= 256 ? 2 : 4;
  const int pt = threadIdx.x, w = pt / 32, lane = pt % 32;
  const int c = pt % CPR, h = (pt % 32) / CPR, rg = pt / CPR;
  // The smem offset (elements) of this thread's chunk in its j-th row r = rg + RG j: the swizzle
  // depends on r % 8, which is the same for every j when RG is a multiple of 8 (d64, d128).
  auto dst_off = [&](int j) {
    const int r = rg + RG * j;
    return ((c / 8) * BN + r) * 64 + (((c % 8) ^ (r % 8)) * 8);
  };
  const int32_t* bt = p.block_table + int64_t(seq) * p.max_pages_per_seq;
  const int P = p.page_size;
  // Lane `lane` finds where row w RPW + lane % RPW + RG (lane / RPW) of a tile lives: its element
  // offset in the pool (page and slot; -1 past kv_len). One block-table read and one division by
  // the page size per lane and tile; the lanes that copy the row take the offset by shuffles.
  // NOTE: the producer's instructions are the kernel's limit here: with a division per copied row
  // the consumers waited on K for 39% of their samples (Nsight Compute, page 16).
  const int my_row = w * RPW + lane % RPW + RG * (lane / RPW);
  auto row_offset = [&](int tile) -> int64_t {
    const int t = t_first + tile * BN + my_row;
    if (lane >= RPW * NJ || t >= L) return -1;
    return int64_t(__ldg(bt + t / P)) * p.page_stride + (t % P) * HEAD_DIM;
  };
  const auto* kpool =
      static_cast<const uint16_t*>(p.k_pages) + int64_t(kvh) * p.head_stride + c * 8;
  const auto* vpool =
      static_cast<const uint16_t*>(p.v_pages) + int64_t(kvh) * p.head_stride + c * 8;
  // Each thread's copies of a tile arrive on the tile's full barrier when they land (the
  // barrier counts 128 arrivals), so the producer never waits for its own copies.
  auto copy_tile = [&](uint16_t* dst, const uint16_t* pool, int64_t off_reg, uint64_t* full) {
    const int lo_reg = int(uint64_t(off_reg)), hi_reg = int(uint64_t(off_reg) >> 32);
#pragma unroll(kUnroll)
    for (int j = 0; j < NJ; ++j) {
      const uint32_t lo = uint32_t(__shfl_sync(0xffffffffu, lo_reg, RPW * j + h));
      const int hi = __shfl_sync(0xffffffffu, hi_reg, RPW * j + h);
      const bool valid = hi >= 0;
      const int64_t off = valid ? (int64_t(hi) << 32) | lo : 0;
      cp_async16(dst + dst_off(j), pool + off, valid);  // past kv_len: 16 zero bytes
    }
    cp_async_arrive_noinc(full);
  };
  int64_t off = ntiles > 0 ? row_offset(0) : -1;
  for (int i = 0; i < ntiles; ++i) {
    const int s = (base + i) % ST;
    const uint32_t ph = ((base + i) / ST) & 1;
    const int64_t next_off = i + 1 < ntiles ? row_offset(i + 1) : -1;
    mbar_wait(&k_empty[s], ph ^ 1);
    copy_tile(sK + s * BN * HEAD_DIM, kpool, off, &k_full[s]);
    mbar_wait(&v_empty[s], ph ^ 1);
    copy_tile(sV + s * BN * HEAD_DIM, vpool, off, &v_full[s]);
    off = next_off;
  }
}

// One work of the kernel: a prefill item for one KV head, and the KV tiles of BN positions its rows
// see, [t_first, t_first + ntiles BN).
struct HopperWork {
  PrefillItem it;
  int kvh, q0, qlen, L, row_end, pos_base, t_first, ntiles;
};

// Work w of the launch. The works go in sections of p.hopper_head_section KV heads (the plan
// sizes a section so that its heads' K/V fit in L2); inside a section, item by item in the plan's
// order (heaviest first), each for every head of the section. A section of one head is the order
// of an (item, head) grid with the item fastest.
template <int BN>
__device__ __forceinline__ HopperWork hopper_work(const AttentionParams& p, int w) {
  HopperWork h;
  const int sec = p.hopper_head_section, per_sec = p.num_prefill_items * sec;
  const int sec_n = w / per_sec, sec_r = w % per_sec;
  const int sec_heads = min(sec, p.num_kv_heads - sec_n * sec);
  h.it = p.prefill_items[sec_r / sec_heads];
  h.kvh = sec_n * sec + sec_r % sec_heads;
  const int G = p.group;
  h.q0 = p.q_indptr[h.it.seq];
  h.qlen = p.q_indptr[h.it.seq + 1] - h.q0;
  h.L = p.kv_len[h.it.seq];
  h.row_end = min(h.it.row_begin + kPrefillRows, h.qlen * G);
  h.pos_base = h.L - h.qlen;
  const int pos_lo = h.pos_base + h.it.row_begin / G, pos_hi = h.pos_base + (h.row_end - 1) / G;
  const int key_hi = p.causal ? pos_hi + 1 : h.L;  // exclusive
  const int key_lo = p.window > 0 ? max(0, pos_lo - p.window + 1) : 0;
  h.t_first = key_lo / BN * BN;
  h.ntiles = key_hi > h.t_first ? (key_hi - h.t_first + BN - 1) / BN : 0;
  return h;
}

// CudaPlanOptions::prefill_trace (a lab instrument): event e of work w, the global timer's ns (or
// `value` for the last event); called by one thread. Compiled in only where the library is built
// with PAGEDATTN_PREFILL_TRACE (CMake option of that name).
// NOTE: compiled in, the marks cost the kernel's registers (spills) even with no buffer given.
constexpr int kPrefillTraceEvents = 8;
__device__ __forceinline__ void prefill_trace_mark(const AttentionParams& p, int w, int e,
                                                   uint64_t value = 0) {
#ifndef PAGEDATTN_PREFILL_TRACE
  return;
#endif
  if (p.prefill_trace == nullptr) return;
  uint64_t t = value;
  if (e + 1 < kPrefillTraceEvents) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  p.prefill_trace[int64_t(w) * kPrefillTraceEvents + e] = t;
}

// The next work of a CTA that has finished taking its first (work blockIdx.x), -1 when none is
// left: a smaller (persistent) grid takes the works past its first gridDim.x from a counter, in
// the plan's order, so that each goes to the CTA that asks first, as the hardware hands out the
// CTAs of a grid of one per work (a static deal in rounds leaves the CTAs' totals apart wherever
// the works' sizes do not fall evenly over a round, e.g. where an L2 section ends in a run of one
// head's works). The CTA that takes the last -1 puts the counters back to zero for the next
// launch.
// NOTE: called by one thread per CTA; p.hopper_counters = {next work - gridDim.x, CTAs done}.
// NOTE: measured on an H100: taking each next index one work ahead (the take's round trip under
// the work before) made batch 1 / 8192 7% slower (batch 4 / 2048 2%): a CTA then holds its next
// work for as long as its current one runs, and the last long works wait behind busy CTAs.
__device__ __forceinline__ int hopper_next_work(const AttentionParams& p) {
  const int total = p.num_prefill_items * p.num_kv_heads, n = int(gridDim.x);
  if (n >= total) return -1;  // one CTA per work
  const int w = n + atomicAdd(&p.hopper_counters[0], 1);
  if (w < total) return w;
  __threadfence();  // this CTA's last take before its count
  if (atomicAdd(&p.hopper_counters[1], 1) == n - 1) {
    __threadfence();
    p.hopper_counters[0] = 0;
    p.hopper_counters[1] = 0;
  }
  return -1;
}

template <class Q, int HEAD_DIM, bool OVERLAP, bool GATHER, bool FP8>
__global__ void __launch_bounds__(kHopperThreads, 1)
    prefill_hopper_kernel(const AttentionParams p, const __grid_constant__ CUtensorMap tm_q,
                          const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  allow_dependent_launch();
  using S = HopperShape<HEAD_DIM, FP8>;
  static_assert(!(FP8 && GATHER), "fp8 pools take tensor copies into staging tiles");
  // The products' element type: q's, or f16 for fp8 pools (e4m3 -> f16 is one instruction per
  // pair, and exact; a bf16 q is converted to f16 in shared memory, clamped to its range, as the
  // decode kernel does).
  using M = std::conditional_t<FP8, F16, Q>;
  constexpr int BM = S::kBM, BN = S::kBN, ST = S::kStages, NB = S::kBlocks;
  constexpr bool kLazy = HEAD_DIM >= 128;  // the online softmax's lazy maximum (kLazyMax)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* k_full = q_full + 1;   // [ST]
  uint64_t* v_full = k_full + ST;  // [ST]
  uint64_t* k_empty = v_full + ST;
  uint64_t* v_empty = k_empty + ST;
  uint64_t* v_zero = v_empty + ST;  // the V tile whose slots past kv_len get zeroed
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem + 1024);  // [NB][BM][64]
  uint16_t* sK = sQ + BM * HEAD_DIM;                        // [ST][NB][BN][64]
  uint16_t* sV = sK + ST * BN * HEAD_DIM;                   // [ST][NB][BN][64]
  // fp8: the K and V staging tiles [NBUF][BN][HEAD_DIM] (e4m3, unswizzled) and their full
  // barriers [NBUF].
  constexpr int NBUF = S::kStagingBufs;
  uint8_t* sKst = reinterpret_cast<uint8_t*>(sV + ST * BN * HEAD_DIM);
  uint8_t* sVst = sKst + NBUF * S::kStagingBytes;
  uint64_t* k_stg = v_zero + 1;
  uint64_t* v_stg = k_stg + NBUF;
  uint64_t* q_empty = v_stg + NBUF;  // both consumer warpgroups done with a work's Q
  uint64_t* work_full = q_empty + 1;     // [2] a work index published
  uint64_t* work_empty = work_full + 2;  // [2] read by every warp that takes it from there
  int* work_slot = reinterpret_cast<int*>(work_empty + 2);  // [2]
  int* issue_geo = work_slot + 2;  // [2][2]: fp8 pools, each side's issuing warp: kvh, seq
  static_assert(8 * (3 + 4 * S::kStages + 2 * S::kStagingBufs + 4) + 6 * sizeof(int) <= 1024,
                "the barriers and the work slots fit their 1 KiB");

  // A CTA runs its works one after the other: thread 0 (the producer's first lane) takes each
  // next one (hopper_next_work) and publishes its index in a slot for the other warps (-1: none
  // left); its own warp gets it by a shuffle, and each role reads the work's geometry itself.
  // NOTE: measured on an H100: publishing the geometry instead (the reads of the item, q_indptr
  // and kv_len, which depend on each other, done once by thread 0) was 6-30% slower.
  // The K/V ring's stages and phases run on across works (`ring`: the tiles of the works
  // before). The producer brings the next work's Q once both consumer warpgroups have issued
  // their last S = Q K^T of the work before (q_empty), and its first K/V tiles as stages free,
  // so a work's start overlaps the end of the one before.
  // Work k >= 1 goes through slot (k - 1) % 2, the n-th time for n = (k - 1) / 2; every thread
  // of the consumer warps and of the other producer warps arrives once it has read it.
  constexpr int kWorkReaders = 32 * (8 + (GATHER || FP8 ? 3 : 1));
  auto publish_work = [&](int k) {  // thread 0: this CTA's k-th work
    if (k == 0) return int(blockIdx.x);
    const int s = (k - 1) & 1, n = (k - 1) >> 1;
    const int w = hopper_next_work(p);
    if (n > 0) mbar_wait(&work_empty[s], (n - 1) & 1);
    work_slot[s] = w;
    mbar_arrive(&work_full[s]);  // release: the slot's value before the arrival
    return w;
  };
  auto read_work = [&](int k) {  // every thread of a warp other than warp 0: its k-th work
    if (k == 0) return int(blockIdx.x);
    const int s = (k - 1) & 1, n = (k - 1) >> 1;
    mbar_wait(&work_full[s], n & 1);
    const int w = *reinterpret_cast<volatile int*>(&work_slot[s]);
    mbar_arrive(&work_empty[s]);
    return w;
  };
  auto warp0_work = [&](int k) {  // warp 0: thread 0 publishes, its lanes take it by a shuffle
    int w = 0;
    if (threadIdx.x == 0) w = publish_work(k);
    return __shfl_sync(0xffffffffu, w, 0);
  };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
  const int G = p.group;

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < ST; ++s) {
      mbar_init(&k_full[s], GATHER ? 128 : 1);
      mbar_init(&v_full[s], GATHER ? 128 : 1);
      mbar_init(&k_empty[s], 2 * 128);
      mbar_init(&v_empty[s], 2 * 128);
    }
    mbar_init(v_zero, 1);
    for (int b = 0; b < NBUF; ++b) {
      mbar_init(&k_stg[b], 1);
      mbar_init(&v_stg[b], 1);
    }
    mbar_init(q_empty, 2 * 128);
    for (int j = 0; j < 2; ++j) {
      mbar_init(&work_full[j], 1);
      mbar_init(&work_empty[j], kWorkReaders);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ================= producer =================
    regs_dealloc<S::template kProducerRegs<OVERLAP>>();
    // Q of the k-th work (128 packed rows = 128 / G tokens x G heads), one bulk tensor copy per
    // 64-column block, from thread 0 in every producer variant, once the work before is done
    // with sQ.
    if (tid == 0) prefetch_tensor_map(&tm_q);
    auto load_q = [&](int k, const HopperWork& h) {
      if (k > 0) mbar_wait(q_empty, (k - 1) & 1);
      mbar_arrive_expect_tx(q_full, S::kQBytes);
#pragma unroll
      for (int b = 0; b < NB; ++b)
        tma_load_3d(sQ + b * BM * 64, &tm_q, q_full, b * 64, h.kvh * G, h.q0 + h.it.row_begin / G);
    };
    if constexpr (FP8) {
      // fp8 pools: warps 0-1 bring K, warps 2-3 V. Lanes of warp 0 (2) put a tile's e4m3 rows
      // into a K (V) staging tile with bulk tensor copies, one per page-sized run of rows, NBUF
      // tiles ahead within a work; the side's 64 threads then convert them to f16 into the
      // swizzled stage (slots past kv_len zeroed), fence and meet at the side's barrier; the
      // issuing warp's lane 0 then arrives on the stage's full barrier (one arrival) and its lanes
      // issue the copy NBUF tiles on into the staging tile just read. The ring's stages and
      // the staging tiles' phases run on across the CTA's works (`ring`: the tiles before).
      const bool v_side = warp >= 2;
      uint8_t* stg = v_side ? sVst : sKst;
      uint64_t* stg_full = v_side ? v_stg : k_stg;
      const CUtensorMap* map = v_side ? &tm_v : &tm_k;
      const bool issuer = warp % 2 == 0;
      if (issuer && lane == 0) prefetch_tensor_map(map);
      // A thread converts 16 values at a time (a piece: chunks c and c + 1 of a row, c even):
      // the side's 64 threads take rows 0 to RS - 1 and the thread rows r0 + RS j, j < J, of one
      // piece column. Its offsets are fixed but for the swizzle's r % 8, which RS = 4 (d256)
      // toggles by 4 from one piece to the next (adding 4 modulo 8 flips bit 2): two sets,
      // even and odd j. They are computed again at every tile from the thread index, read anew
      // so that the compiler does not keep them: held through the tiles (with the work's state,
      // in the producer's 40 registers), they spilled.
      // Which thread takes which piece keeps shared memory free of bank conflicts: the 8 lanes
      // of a quarter-warp (one 128-bit access's wavefront) take rows r and r ^ 1, four pieces
      // (one 64-column block) of each: reading, row r's from the staging row's one 64-byte half
      // and row r ^ 1's from the other; writing chunk c, (c ^ r % 8) and (c' ^ (r ^ 1) % 8) lie
      // in different 16-byte slots of the 128-byte bank line. (Lanes with one row's 8 pieces
      // wrote their even chunks to four slots, two lanes each: twice the wavefronts.)
      // hq: the thread's 4-lane group within its row pair; b: its block, the pair's second row
      // taking the other parity of block (one block at d64, where the rows' halves differ).
      constexpr int HPR = HEAD_DIM / 16;  // pieces per row: 4, 8, 16
      constexpr int GPR = HEAD_DIM / 64;  // 64-column blocks per row: 1, 2, 4
      constexpr int RS = 64 / HPR;        // rows between a thread's pieces: 16, 8, 4
      constexpr int J = BN / RS;          // pieces per thread and tile: 8, 16, 16
      static_assert(RS % 4 == 0, "a thread's rows keep r % 8 or toggle its bit 2");
      struct Pieces {
        int r0, src_at, dst_even[2], dst_odd[2];
      };
      auto pieces = [&]() {
        uint32_t t;
        asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
        const int c = int(t % 64u);
        const int hq = c % (8 * GPR) / 4, b = ((hq / 2) ^ (hq % 2)) % GPR;
        Pieces q;
        q.r0 = 2 * (c / (8 * GPR)) + hq % 2;
        const int c0 = 2 * (4 * b + c % 4);
        auto chunk_at = [&](int r, int cc) {  // element offset of 16-byte chunk cc of row r
          return ((cc / 8) * BN + r) * 64 + ((cc % 8) ^ (r % 8)) * 8;
        };
        q.dst_even[0] = chunk_at(q.r0, c0);
        q.dst_even[1] = chunk_at(q.r0, c0 + 1);
        q.dst_odd[0] = chunk_at(q.r0 + RS, c0) - RS * 64;
        q.dst_odd[1] = chunk_at(q.r0 + RS, c0 + 1) - RS * 64;
        q.src_at = q.r0 * HEAD_DIM + c0 * 8;  // bytes into a staging tile
        return q;
      };
      int ring = 0;
      for (int k = 0;; ++k) {  // the CTA's works
        const int w = warp == 0 ? warp0_work(k) : read_work(k);
        if (w < 0) break;
        const HopperWork h = hopper_work<BN>(p, w);
        const int L = h.L, g_end = ring + h.ntiles;
        if (tid == 0) load_q(k, h);
        // The issuing warp's lanes read the work's head and sequence from shared memory when
        // they issue, not from registers held through the tiles: the converting loop's 40
        // registers spilled with them.
        int* geo = issue_geo + 2 * int(v_side);
        if (issuer && lane == 0) {
          geo[0] = h.kvh;
          geo[1] = h.it.seq;
        }
        __syncwarp();
        // The ring's tile g, the work's rows from t, goes to staging buffer g % NBUF.
        auto issue_tile = [&](int g, int t) {
          const int P = p.page_size, PB = p.tma_box_rows;
          const int32_t* bt = p.block_table + int64_t(geo[1]) * p.max_pages_per_seq;
          t = min(t + lane * PB, L - 1);
          const bool copies = lane < BN / PB;
          const int page = copies ? bt[t / P] : 0, slot = t % P / PB * PB;
          uint8_t* buf = stg + (g % NBUF) * S::kStagingBytes;
          if (lane == 0) mbar_arrive_expect_tx(&stg_full[g % NBUF], BN * HEAD_DIM);
          __syncwarp();
          if (copies)
            tma_load_4d(buf + lane * PB * HEAD_DIM, map, &stg_full[g % NBUF], 0, slot, geo[0],
                        page);
        };
        // (The staging tiles are free: the side's threads finished reading them before the
        // barrier that ended the work before.)
        if (issuer)
          for (int g = ring; g < min(ring + NBUF, g_end); ++g)
            issue_tile(g, h.t_first + (g - ring) * BN);
        int t0 = h.t_first;
        for (int g = ring; g < g_end; ++g, t0 += BN) {
          const int s = g % ST;
          const uint32_t ph = (g / ST) & 1;
          mbar_wait(&stg_full[g % NBUF], (g / NBUF) & 1);
          mbar_wait(v_side ? &v_empty[s] : &k_empty[s], ph ^ 1);
          const Pieces q = pieces();
          const int r0 = q.r0;
          const int* dst_even = q.dst_even;
          const int* dst_odd = q.dst_odd;
          const uint8_t* src = stg + (g % NBUF) * S::kStagingBytes + q.src_at;
          uint16_t* dst = (v_side ? sV : sK) + s * BN * HEAD_DIM;
          // Rows at or past `valid` (slots past kv_len) are written as zeros.
          const int valid = L - t0 - r0;
          auto convert = [&](bool full) {
            auto load = [&](int j) {
              uint4 in = make_uint4(0, 0, 0, 0);
              if (full || RS * j < valid)
                in = *reinterpret_cast<const uint4*>(src + RS * j * HEAD_DIM);
              return in;
            };
            // Piece j + 1 is read before piece j is converted, so that the read's latency
            // overlaps the conversion (one piece at a time, read ahead: the loop's registers).
            uint4 in = load(0);
#pragma unroll
            for (int j = 0; j < J; ++j) {
              const uint4 next = j + 1 < J ? load(j + 1) : make_uint4(0, 0, 0, 0);
              uint16_t* row = dst + RS * j * 64;
              const int* at = j % 2 == 0 || RS % 8 == 0 ? dst_even : dst_odd;
              *reinterpret_cast<uint4*>(row + at[0]) = e4m3x8_to_f16(make_uint2(in.x, in.y));
              *reinterpret_cast<uint4*>(row + at[1]) = e4m3x8_to_f16(make_uint2(in.z, in.w));
              in = next;
            }
          };
          if (t0 + BN <= L)
            convert(true);
          else
            convert(false);
          // NOTE: measured on an H100 against every thread arriving before the barrier (64
          // arrivals a tile; d128, three rounds): fp8 time -2.8% at batch 1 / 8192 and -2.6% at
          // batch 4 / 2048, every round ahead; batch 1 / 2048 and 4 / 8192 within their spread.
          fence_proxy_async();
          named_bar_sync(3 + int(v_side), 64);
          if (issuer) {
            if (lane == 0) mbar_arrive(v_side ? &v_full[s] : &k_full[s]);
            if (g + NBUF < g_end) issue_tile(g + NBUF, t0 + NBUF * BN);
          }
        }
        __syncwarp();  // the issuing lanes read geo before lane 0 writes the next work's
        ring = g_end;
      }
      return;
    }
    if constexpr (GATHER) {
      int ring = 0;
      for (int k = 0;; ++k) {  // the CTA's works
        const int w = warp == 0 ? warp0_work(k) : read_work(k);
        if (w < 0) break;
        const HopperWork h = hopper_work<BN>(p, w);
        if (tid == 0) load_q(k, h);
        produce_gather<HEAD_DIM>(p, h.it.seq, h.kvh, h.t_first, h.ntiles, h.L, ring, sK, sV,
                                 k_full, v_full, k_empty, v_empty);
        ring += h.ntiles;
      }
      // Nothing of this thread's in flight when it leaves (its copies belong to no commit group
      // yet: wait_group alone would not wait for them).
      cp_async_commit();
      cp_async_wait<0>();
      return;
    }
    // Warp 0 brings Q and the K tiles, warp 1 the V tiles: their bulk copies issue side by side.
    // NOTE: measured on an H100 (batch 1, length 8192, d128, page 16, where a tile is 16 copies
    // of 2 KiB for K and 16 for V): one warp issuing both, 445 TFLOP/s; two, 527; four (two
    // per tile, a column block each), no faster.
    if (warp > 1) return;
    const bool v_warp = warp == 1;
    const int P = p.page_size, PB = p.tma_box_rows, nsub = BN / PB;  // nsub <= 16
    if (lane == 0) prefetch_tensor_map(v_warp ? &tm_v : &tm_k);
    int ring = 0, zeroed = 0;  // zeroed: V tiles that crossed kv_len so far (v_zero's phase)
    for (int k = 0;; ++k) {  // the CTA's works
      const int w = v_warp ? read_work(k) : warp0_work(k);
      if (w < 0) break;
      const HopperWork h = hopper_work<BN>(p, w);
      if (tid == 0) {
        load_q(k, h);
        prefill_trace_mark(p, w, 6);
        prefill_trace_mark(p, w, 7,
                           (uint64_t(blockIdx.x) << 32) | uint32_t(k) << 16 | uint32_t(h.ntiles));
      }
      const int32_t* bt = p.block_table + int64_t(h.it.seq) * p.max_pages_per_seq;
      // Lane j < nsub copies rows [t0 + j PB, t0 + (j + 1) PB) of a tile: one box per column
      // block, inside one page. Its page id is read one tile ahead, so that the block-table read
      // is off the path from a free stage to the copy.
      // NOTE: boxes past kv_len read the last page again (never the block table past the
      // sequence's pages); those rows are masked, and zeroed in V.
      auto box_of = [&](int tile, int& page, int& slot) {
        const int t = min(h.t_first + tile * BN + lane * PB, h.L - 1);
        page = lane < nsub ? bt[t / P] : 0;
        slot = t % P / PB * PB;
      };
      auto load_tile = [&](uint16_t* dst, const CUtensorMap* map, uint64_t* bar, int page,
                           int slot) {
        if (lane < nsub) {
#pragma unroll
          for (int b = 0; b < NB; ++b)
            tma_load_4d(dst + (b * BN + lane * PB) * 64, map, bar, b * 64, slot, h.kvh, page);
        }
      };
      int page = 0, slot = 0;
      if (h.ntiles > 0) box_of(0, page, slot);
      for (int i = 0; i < h.ntiles; ++i) {
        const int g = ring + i, s = g % ST;
        const uint32_t ph = (g / ST) & 1;
        const int t0 = h.t_first + i * BN;
        int next_page = 0, next_slot = 0;
        if (i + 1 < h.ntiles) box_of(i + 1, next_page, next_slot);
        if (!v_warp) {
          if (lane == 0) {
            mbar_wait(&k_empty[s], ph ^ 1);
            mbar_arrive_expect_tx(&k_full[s], S::kTileBytes);
          }
          __syncwarp();
          load_tile(sK + s * BN * HEAD_DIM, &tm_k, &k_full[s], page, slot);
        } else {
          const bool zero = t0 + BN > h.L;  // warp-uniform; at most one tile of a work
          uint64_t* vbar = zero ? v_zero : &v_full[s];
          if (lane == 0) {
            mbar_wait(&v_empty[s], ph ^ 1);
            mbar_arrive_expect_tx(vbar, S::kTileBytes);
          }
          __syncwarp();
          load_tile(sV + s * BN * HEAD_DIM, &tm_v, vbar, page, slot);
          if (zero) {
            mbar_wait(v_zero, zeroed & 1);
            ++zeroed;
            uint16_t* tile = sV + s * BN * HEAD_DIM;
            const int r0 = h.L - t0, per_block = (BN - r0) * 8;  // 16-byte chunks
            for (int c = lane; c < per_block * NB; c += 32) {
              const int b = c / per_block, r = r0 + c % per_block / 8, ch = c % 8;
              *reinterpret_cast<uint4*>(tile + (b * BN + r) * 64 + ch * 8) =
                  make_uint4(0, 0, 0, 0);
            }
            fence_proxy_async();
            __syncwarp();
            if (lane == 0) mbar_arrive(&v_full[s]);
          }
        }
        page = next_page;
        slot = next_slot;
      }
      ring += h.ntiles;
    }
    return;
  }

  // ================= consumers =================
  regs_alloc<S::template kConsumerRegs<OVERLAP>>();
  // The warpgroup index through a shuffle from lane 0: ptxas then knows it is warp-uniform and
  // keeps what derives from it (Q's descriptor) in uniform registers.
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0), wq = warp % 4;
  // Ping-pong (p.hopper_pingpong, overlapped loop only): the two warpgroups take turns at issuing
  // their products, so that one's softmax runs while the other's products hold the tensor cores.
  // Warpgroup c waits on named barrier 1 + c for its turn and, once its products are issued,
  // hands the turn over on the other's; warpgroup 1 hands warpgroup 0 its first turn. Both take
  // the same number of turns (a warpgroup passes the turns of tiles it does not see), and
  // warpgroup 0 takes a last one at the end, so every barrier's arrivals are matched.
  const bool pingpong = OVERLAP && p.hopper_pingpong;
  auto pp_sync = [&] {
    if (pingpong) named_bar_sync(1 + cw, 2 * 128);
  };
  auto pp_pass = [&] {
    if (pingpong) named_bar_arrive(2 - cw, 2 * 128);
  };
  if (pingpong && cw == 1) named_bar_arrive(1, 2 * 128);
  const uint32_t q_addr = smem_u32(sQ) + cw * 64 * 128;
  // The products' base descriptors: this warpgroup's rows of Q, stage 0 of K and of V.
  const uint64_t q_desc = wgmma_desc(q_addr, 16, 1024);
  const uint64_t k_desc0 = wgmma_desc(smem_u32(sK), 16, 1024);
  const uint64_t v_desc0 = wgmma_desc(smem_u32(sV), BN * 128, 1024);
  float o[HEAD_DIM / 2];
  float sc[BN / 2];         // S of one tile, then its probabilities
  uint32_t pa[BN / 16][4];  // P as the A fragments of O += P V (16 keys per k step)
  float alpha[2];           // the rescale of O that the last softmax asks for
  int ring = 0;
  // The CTA's next work and its geometry are taken before the rows of the one before are stored
  // (the reads' latency under the stores').
  // NOTE: measured on an H100 against taking them after the stores: 3-7% faster at batch 1 to
  // 64 x 512-2048 positions, 1.4% at batch 1 x 8192.
  int w = read_work(0);
  HopperWork wk{};
  if (w >= 0) wk = hopper_work<BN>(p, w);
  for (int k = 0; w >= 0; ++k) {
    if (tid == 128) prefill_trace_mark(p, w, 0);
    const PrefillItem it = wk.it;
    const int kvh = wk.kvh, q0 = wk.q0, L = wk.L, row_end = wk.row_end, pos_base = wk.pos_base;
    const int t_first = wk.t_first, ntiles = wk.ntiles;
    // The ring's stage and phase of this work's tile i.
    auto stage = [&](int i) { return (ring + i) % ST; };
    auto phase = [&](int i) { return uint32_t((ring + i) / ST) & 1; };
    const int r_base = it.row_begin + 64 * cw;
    const bool has_rows = r_base < row_end;
    const int wg_pos_lo = pos_base + r_base / G;
    const int wg_pos_hi = pos_base + (min(r_base + 64, row_end) - 1) / G;
    // The other warpgroup's rows and positions (its turns are matched by this one's).
    const int o_base = it.row_begin + 64 * (1 - cw);
    const bool o_rows = o_base < row_end;
    const int o_pos_lo = pos_base + o_base / G;
    const int o_pos_hi = pos_base + (min(o_base + 64, row_end) - 1) / G;
    // This thread's packed rows h = 0, 1 (lane / 4 and lane / 4 + 8 of its warp's 16); their
    // positions are computed where a mask or the store needs them (registers are short).
    auto packed_row = [&](int h) { return r_base + wq * 16 + lane / 4 + 8 * h; };
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    // The logits' scale (fp8 pools: times the KV head's K scale, as the stored values are
    // K / scale) and log2(e) * scale per unit of a raw score (1 once the soft-cap has rescaled
    // the scores).
    const float qk_scale = FP8 ? p.scale * p.k_scale[kvh] : p.scale;
    const float log2_unit = p.softcap > 0.f ? 1.f : qk_scale * kLog2e;

    // The tiles [a, b] of this work that rows at positions [lo, hi] see (a = ntiles, b = -1 for
    // none): tile i (keys from t0 = t_first + i BN) is seen where rows exist, t0 <= hi when
    // causal, and t0 + BN - 1 > lo - window with a window; so the tiles seen are contiguous.
    // NOTE: a loop over the tiles testing each took about 0.06 us a tile of a work's start, on
    // the path to its first product (4 us at 64 tiles; H100, LAB_PREFILL_TRACE).
    auto tile_range = [&](bool rows, int lo, int hi, int& a, int& b) {
      a = 0;
      b = ntiles - 1;
      if (p.causal) b = hi < t_first ? -1 : min(b, (hi - t_first) / BN);
      if (p.window > 0) {
        const int x = lo - p.window - t_first - BN + 1;  // tile i is seen where i BN > x
        a = x < 0 ? 0 : x / BN + 1;
      }
      if (!rows || a > b) a = ntiles, b = -1;
    };
    auto tile_full = [&](int t0) {
      return t0 + BN <= L && (!p.causal || t0 + BN - 1 <= wg_pos_lo) &&
             (p.window == 0 || t0 > wg_pos_hi - p.window) && r_base + 64 <= row_end;
    };
    // S = Q K^T (64 x BN per warpgroup), issued and committed, not waited for. Every
    // descriptor is one add past a base (wgmma_desc_add).
    // NOTE: the stage goes through a shuffle from lane 0 so that ptxas sees it warp-uniform: the
    // descriptors are then built in uniform registers, not built per thread and moved over (an
    // R2UR pair before every wgmma; the issue took a third of the consumers' samples).
    auto issue_s = [&](int s) {
      s = __shfl_sync(0xffffffffu, s, 0);
      const uint64_t k_desc = wgmma_desc_add(k_desc0, uint32_t(s) * S::kTileBytes);
#pragma unroll
      for (int j = 0; j < BN / 2; ++j) sc[j] = 0.f;
      fence_regs(sc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        const uint32_t off = (kk % 4) * 32;  // 16 elements along K inside the 128-byte row
        const uint64_t da = wgmma_desc_add(q_desc, (kk / 4) * BM * 128 + off);
        const uint64_t db = wgmma_desc_add(k_desc, (kk / 4) * BN * 128 + off);
        wgmma_ss<M, BN>(sc, da, db, kk > 0);
      }
      wgmma_commit();
    };
    // O += P V, issued and committed, not waited for.
    auto issue_pv = [&](int s) {
      s = __shfl_sync(0xffffffffu, s, 0);
      const uint64_t v_desc = wgmma_desc_add(v_desc0, uint32_t(s) * S::kTileBytes);
      fence_regs(o);
      fence_regs(pa);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        wgmma_rs_tb<M, HEAD_DIM>(o, pa[kk], wgmma_desc_add(v_desc, kk * 16 * 128));
      wgmma_commit();
    };
    // Soft-cap and mask S (masks only where the tile crosses a boundary), then the online softmax
    // (rows lane/4 and lane/4 + 8 of the warp; a quad shares a row): m, l and alpha. Scores stay
    // unscaled (in units of log2_unit) until one FMA per element folds the scale into the exponent.
    // NOTE: the soft-cap and mask branches sit outside the element loops: inside, the compiler
    // evaluated tanh and the mask for every element of every tile.
    auto softmax = [&](int t0, bool full) {
      if (p.softcap > 0.f) {
#pragma unroll
        for (int j = 0; j < BN / 2; ++j)
          sc[j] = p.softcap * tanhf(sc[j] * qk_scale / p.softcap) * kLog2e;
      }
      if (!full) {
        int row_pos[2];
        bool row_ok[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          row_ok[h] = packed_row(h) < row_end;
          row_pos[h] = pos_base + packed_row(h) / G;
        }
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int t = t0 + n * 8 + (lane & 3) * 2 + (e & 1), h = e >> 1;
            const bool vis = row_ok[h] && t < L && (!p.causal || t <= row_pos[h]) &&
                             (p.window == 0 || t > row_pos[h] - p.window);
            if (!vis) sc[4 * n + e] = -INFINITY;
          }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
          mx = fmaxf(mx, fmaxf(sc[4 * n + 2 * h], sc[4 * n + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // From head dim 128 the running maximum moves only when the tile's passes it by more than
        // kLazyMax (log2 units; always from -inf): until then the exponentials stay below
        // 2^kLazyMax, and alpha is exactly 1, so O is not rescaled.
        const float mx2 = mx * log2_unit;
        const float mn = kLazy ? (mx2 > m[h] + kLazyMax ? mx2 : m[h]) : fmaxf(m[h], mx2);
        const float mref = mn == -INFINITY ? 0.f : mn;
        alpha[h] = ex2_ftz(m[h] - mref);
        m[h] = mn;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
          sc[4 * n + 2 * h] = ex2_ftz(fmaf(sc[4 * n + 2 * h], log2_unit, -mref));
          sc[4 * n + 2 * h + 1] = ex2_ftz(fmaf(sc[4 * n + 2 * h + 1], log2_unit, -mref));
          sum += sc[4 * n + 2 * h] + sc[4 * n + 2 * h + 1];
        }
        l[h] = l[h] * alpha[h] + sum;
      }
    };
    // O *= alpha (no product may be in flight), and P into the A fragments.
    auto rescale_and_pack = [&]() {
      if (!kLazy || alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[4 * n + e] *= alpha[e >> 1];
      }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pa[kk][0] = cvt_pack2<M>(sc[8 * kk + 0], sc[8 * kk + 1]);
        pa[kk][1] = cvt_pack2<M>(sc[8 * kk + 2], sc[8 * kk + 3]);
        pa[kk][2] = cvt_pack2<M>(sc[8 * kk + 4], sc[8 * kk + 5]);
        pa[kk][3] = cvt_pack2<M>(sc[8 * kk + 6], sc[8 * kk + 7]);
      }
    };

    mbar_wait(q_full, k & 1);
    if (tid == 128) prefill_trace_mark(p, w, 1);
    if constexpr (FP8 && Q::kDType == DType::bf16) {
      // This warpgroup's 64 rows of Q, bf16 -> f16 in place (the layout is per element): 16-byte
      // vectors i = wt + 128 j of its NB blocks of 512, all read before the first is converted.
      // NOTE: measured on an H100 against a loop over words (a read, a conversion and a write
      // at a time): see docs/BENCHMARKS.md, "fp8 K/V in prefill: q's conversion".
      const int wt = tid % 128;
      constexpr int NV = NB * 4;  // vectors a thread: 4, 8, 16
      auto q_vec = [&](int j) {
        const int i = wt + 128 * j;
        return reinterpret_cast<uint4*>(sQ + (i / 512) * BM * 64 + cw * 64 * 64) + i % 512;
      };
      uint4 qv[NV];
#pragma unroll
      for (int j = 0; j < NV; ++j) qv[j] = *q_vec(j);
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        uint32_t* word = &qv[j].x;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float f[2];
          Bf16::word_to_float(word[e], f);
          word[e] = cvt_pack2<F16>(fminf(fmaxf(f[0], -65504.f), 65504.f),
                                   fminf(fmaxf(f[1], -65504.f), 65504.f));
        }
        *q_vec(j) = qv[j];
      }
      fence_proxy_async();
      named_bar_sync(5 + cw, 128);
    }
    if constexpr (!OVERLAP) {
      // One tile after the other: S, softmax, P V. Q is free after the last tile's S.
      int first_s, last_s;
      tile_range(has_rows, wg_pos_lo, wg_pos_hi, first_s, last_s);
      if (last_s < 0) mbar_arrive(q_empty);
      for (int i = 0; i < ntiles; ++i) {
        const int s = stage(i), t0 = t_first + i * BN;
        const uint32_t ph = phase(i);
        const bool need = i >= first_s && i <= last_s;
        mbar_wait(&k_full[s], ph);
        if (need) {
          issue_s(s);
          wgmma_wait<0>();
          fence_regs(sc);
          if (i == last_s) mbar_arrive(q_empty);
        }
        mbar_arrive(&k_empty[s]);
        if (need) {
          softmax(t0, tile_full(t0));
          rescale_and_pack();
        }
        mbar_wait(&v_full[s], ph);
        if (need) {
          issue_pv(s);
          wgmma_wait<0>();
          fence_regs(o);
        }
        mbar_arrive(&v_empty[s]);
      }
    } else {
      // The softmax of tile i runs while the tensor cores do P V of tile i - 1: S(i) and PV(i - 1)
      // are issued back to back, S(i) is waited for (wgmma groups complete in order), and PV(i - 1)
      // only before O is rescaled.
      // NOTE: the tiles this warpgroup sees are contiguous (the causal limit bounds them above, the
      // window below); the wgmma issues sit on straight paths over them, since ptxas serialises
      // every wgmma of a kernel whose issues or waits it finds on divergent paths.
      // This warpgroup's tiles [i_lo, i_hi], the other's [j_lo, j_hi].
      int i_lo, i_hi, j_lo, j_hi;
      tile_range(has_rows, wg_pos_lo, wg_pos_hi, i_lo, i_hi);
      tile_range(o_rows, o_pos_lo, o_pos_hi, j_lo, j_hi);
      // Ping-pong turns go in tile order over the tiles either warpgroup sees, [u_lo, u_hi]: turn
      // i issues S(i) and P V(i - 1), and turn u_hi + 1 the last P V. A warpgroup passes the turns
      // of tiles it does not see right after skipping them, so that neither runs ahead of the tiles
      // the other still holds (the producer refills a stage only once both are done with it).
      const int u_lo = min(i_lo, j_lo), u_hi = max(i_hi, j_hi);
      auto skip = [&](int i) {
        const int s = stage(i);
        const uint32_t ph = phase(i);
        mbar_wait(&k_full[s], ph);
        mbar_arrive(&k_empty[s]);
        mbar_wait(&v_full[s], ph);
        mbar_arrive(&v_empty[s]);
      };
      auto skip_and_pass = [&](int i) {
        skip(i);
        pp_sync();
        pp_pass();
      };
      for (int i = 0; i < min(u_lo, ntiles); ++i) skip(i);
      if (i_lo <= i_hi) {
        for (int i = u_lo; i < i_lo; ++i) skip_and_pass(i);
        // The stage and phase of the tile last issued, stepped along (no division per tile).
        int cs = stage(i_lo);
        uint32_t cph = phase(i_lo);
        {
          const int s = cs, t0 = t_first + i_lo * BN;
          mbar_wait(&k_full[s], cph);
          pp_sync();
          issue_s(s);
          pp_pass();
          wgmma_wait<0>();
          fence_regs(sc);
          if (tid == 128) prefill_trace_mark(p, w, 2);
          mbar_arrive(&k_empty[s]);
          softmax(t0, tile_full(t0));
          rescale_and_pack();
        }
        for (int i = i_lo + 1; i <= i_hi; ++i) {
          const int ps = cs;
          const uint32_t pph = cph;
          cs = cs + 1 == ST ? 0 : cs + 1;
          cph ^= cs == 0 ? 1u : 0u;
          const int s = cs, t0 = t_first + i * BN;
          mbar_wait(&k_full[s], cph);
          pp_sync();
          issue_s(s);
          mbar_wait(&v_full[ps], pph);
          issue_pv(ps);
          pp_pass();
          wgmma_wait<1>();
          fence_regs(sc);
          mbar_arrive(&k_empty[s]);
          softmax(t0, tile_full(t0));
          wgmma_wait<0>();
          fence_regs(o);
          mbar_arrive(&v_empty[ps]);
          rescale_and_pack();
        }
        mbar_arrive(q_empty);  // S(i_hi), this warpgroup's last, has completed
        const int s = cs;  // tile i_hi's
        mbar_wait(&v_full[s], cph);
        pp_sync();
        issue_pv(s);
        pp_pass();
        wgmma_wait<0>();
        fence_regs(o);
        if (tid == 128) prefill_trace_mark(p, w, 3);
        mbar_arrive(&v_empty[s]);
        for (int i = i_hi + 1; i <= u_hi; ++i) skip_and_pass(i);
      } else {
        mbar_arrive(q_empty);
        for (int i = u_lo; i <= u_hi; ++i) skip_and_pass(i);
        if (u_lo <= u_hi) {  // the other's last P V
          pp_sync();
          pp_pass();
        }
      }
      for (int i = u_lo <= u_hi ? u_hi + 1 : ntiles; i < ntiles; ++i) skip(i);
    }

    // The next work and its geometry, their reads issued before the stores.
    const int w_next = read_work(k + 1);
    HopperWork wk_next{};
    if (w_next >= 0) wk_next = hopper_work<BN>(p, w_next);
    if (tid == 128) prefill_trace_mark(p, w, 5);

    // ---- normalise and store ----
    // NOTE: tried on an H100: a 4 x 4 transpose of each quad's words by shuffles, so that a warp
    // stores 8 rows x 64 bytes an instruction instead of 8 x 16, took a work's stores from about
    // 2.0 to 1.4 us (LAB_PREFILL_TRACE), but it added register spills and the tiles ran longer:
    // batch 1 / 8192 and batch 4 / 2048 1-7% slower than without. The consumers' code has no
    // spill as it is (the SASS); even one swapped word a lane pair spilled inside the tile loop.
    // Also tried: the rows written into half of the work's last K (or V) stage and stored from
    // there a 16-byte chunk a thread, the producer refilling that stage after the stores: no spill
    // (once the epilogue had no branch), but 1-3% slower at batch 1 / 8192 and level at 2048. A
    // timing-only build without any store here was 0.9% faster at batch 1 / 8192 (3-4.5% at
    // 2048 positions): the stores are not what holds that shape under 600 TFLOP/s.
    uint16_t* out = static_cast<uint16_t*>(p.out);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int pr = packed_row(h);
      if (pr >= row_end) continue;
      const float inv = (sum > 0.f ? 1.f / sum : 0.f) * (FP8 ? p.v_scale[kvh] : 1.f);
      uint16_t* dst =
          out + (int64_t(q0 + pr / G) * p.num_q_heads + kvh * G + pr % G) * HEAD_DIM +
          (lane & 3) * 2;
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n)
        *reinterpret_cast<uint32_t*>(dst + n * 8) =
            cvt_pack2<Q>(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
    }
    if (tid == 128) prefill_trace_mark(p, w, 4);
    ring += ntiles;
    w = w_next;
    wk = wk_next;
  }  // works
  if (pingpong && cw == 0) named_bar_sync(1, 2 * 128);  // warpgroup 1's last hand-over
#endif
}

}  // namespace pagedattn::cuda

namespace pagedattn::cuda {

// The three tensor maps of one launch (encoded on the host by prefill_hopper.cu).
struct HopperMaps {
  CUtensorMap q, k, v;
};

template <class Q, int HEAD_DIM, bool OVERLAP, bool GATHER, bool FP8>
void launch_prefill_hopper_g(const AttentionParams& p, const HopperMaps& m, cudaStream_t s) {
  using S = HopperShape<HEAD_DIM, FP8>;
  static std::atomic<uint64_t> configured{0};  // per kernel instance, per device
  set_smem_limit_on_this_device(prefill_hopper_kernel<Q, HEAD_DIM, OVERLAP, GATHER, FP8>,
                                int(S::kSmemBytes), configured,
                                "paged_attention_cuda: Hopper prefill shared memory attribute");
  const int64_t works = int64_t(p.num_prefill_items) * p.num_kv_heads;
  const bool persist = p.hopper_ctas > 0;  // else one CTA per work (each finds none left)
  const dim3 grid(unsigned(persist ? std::min<int64_t>(works, p.hopper_ctas) : works));
  prefill_hopper_kernel<Q, HEAD_DIM, OVERLAP, GATHER, FP8>
      <<<grid, kHopperThreads, S::kSmemBytes, s>>>(p, m.q, m.k, m.v);
  check_launch("paged_attention_cuda: Hopper prefill kernel launch");
}

// FP8: e4m3 pools (tensor copies into staging tiles, converted by the producer; never gathered).
template <class Q, int HEAD_DIM, bool OVERLAP, bool FP8>
void launch_prefill_hopper_o(const AttentionParams& p, const HopperMaps& m, cudaStream_t s) {
  if constexpr (FP8) {
    return launch_prefill_hopper_g<Q, HEAD_DIM, OVERLAP, false, true>(p, m, s);
  } else {
    if (p.hopper_gather) return launch_prefill_hopper_g<Q, HEAD_DIM, OVERLAP, true, false>(p, m, s);
    launch_prefill_hopper_g<Q, HEAD_DIM, OVERLAP, false, false>(p, m, s);
  }
}

template <class Q, int HEAD_DIM, bool FP8>
void launch_prefill_hopper_t(const AttentionParams& p, const HopperMaps& m, cudaStream_t s) {
  // NOTE: at head_dim 256 the overlapped loop spills registers (O alone is 128 per thread).
  if constexpr (HEAD_DIM <= 128) {
    if (p.prefill_kernel == kPrefillWgmma)
      return launch_prefill_hopper_o<Q, HEAD_DIM, true, FP8>(p, m, s);
  }
  launch_prefill_hopper_o<Q, HEAD_DIM, false, FP8>(p, m, s);
}

template <class Q, bool FP8 = false>
void launch_prefill_hopper_q(const AttentionParams& p, int head_dim, const HopperMaps& m,
                             cudaStream_t s) {
  switch (head_dim) {
    case 64:
      return launch_prefill_hopper_t<Q, 64, FP8>(p, m, s);
    case 128:
      return launch_prefill_hopper_t<Q, 128, FP8>(p, m, s);
    case 256:
      return launch_prefill_hopper_t<Q, 256, FP8>(p, m, s);
    default:
      fail("paged_attention_cuda: head_dim ", head_dim, " is not supported (64, 128 or 256)");
  }
}

// Rows of K/V per bulk copy: whole boxes inside one page and one KV tile.
constexpr int hopper_box_rows(int page_size, int head_dim) {
  int a = page_size, b = head_dim >= 256 ? 64 : 128;
  while (b) {
    const int t = a % b;
    a = b;
    b = t;
  }
  return a;
}

}  // namespace pagedattn::cuda
