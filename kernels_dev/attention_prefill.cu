// Kernel lab: paged prefill attention (ragged q_len > 1, causal, chunked), versions side by side.
//
//   attention_prefill_lab           correctness gate on every version, then the timing sweep
//   LAB_PREFILL_TRACE=4:2048 attention_prefill_lab   v8's per-work timeline on one shape (needs
//                                   the library built with -DPAGEDATTN_PREFILL_TRACE=ON)
//
// Versions:
//   v1  the decode kernel run once per query row (CudaPlanOptions::tensor_core_prefill = false):
//       CUDA cores, each K/V row re-read from L2 by every query row.
//   v2  tensor-core kernel: mma.sync m16n8k16 over tiles of 64 packed
//       (query, head-in-group) rows against 64-key tiles gathered from the pages, online softmax
//       in fp32 (the kernel of every GPU but sm_90, and of the shapes v3 does not take).
//   v3  Hopper kernel, serial (sm_90a; CudaPlanOptions::hopper_prefill_overlap = false): a
//       producer warp brings Q and 128-key K/V tiles in with bulk tensor copies (one tensor map
//       over each pool, the page id as its outer coordinate) into stages guarded by mbarriers;
//       two consumer warpgroups of 64 packed rows each run S = Q K^T and O += P V on wgmma (P
//       from registers, V N-major from shared memory), one step after the other.
//   v4  (the default until 2026-11-26) v3 with the softmax of tile i running while P V of
//       tile i - 1 is on the tensor cores; since 2026-11-25 warp 0 issues the K copies and warp 1
//       the V copies (one warp issued both).
//   v5  v4 with K and V gathered by the producer warpgroup's 128 threads with cp.async into the
//       same swizzled stages instead of one bulk tensor copy per page-sized run of rows (2 KiB
//       copies at page 16), slots past kv_len zero-filled by the copies: the library's path for
//       pages that are not a multiple of 8 tokens, which no tensor copy takes.
//   v6  v4 with its works (a tile of packed rows for one KV head) in one order over all heads:
//       heaviest first across the KV heads of a section whose K/V fit in L2 (v4: one head's
//       tiles after the other's, heaviest first within a head).
//   v7  (the default 2026-11-26) v6 with the consumer warpgroups taking turns at issuing their
//       products (ping-pong by named barriers), so that one's softmax runs under the other's
//       products.
//   v8  (promoted, the default since 2026-11-27) v7 on a persistent grid
//       (CudaPlanOptions::hopper_ctas = -1): one CTA per SM, each taking its next work from a
//       counter in the plan's order as it nears the end of the one before (the order the
//       hardware gives a grid of one CTA per work), the next work's Q brought in once both
//       consumer warpgroups have issued their last S, the K/V ring running on across works.
//       fp8 pools joined it later that day, once their converting producer's loop held fewer
//       registers (it had spilled with the works' state).
//       Since the same day every version's wgmma descriptors are one add past a base built once
//       (a third of the consumers' stall samples had been on integer instructions): batch 1 /
//       8192 / d128 545 -> 563-567 TFLOP/s in the attention benchmark.
//       And since 2026-11-27 (evening) the descriptors live in uniform registers: ptxas had
//       built them per thread and moved each to uniform registers (an R2UR pair waited on before
//       every wgmma; Nsight Compute's per-instruction samples put a third of the consumers' time
//       in the products' issue), because it could not prove the warpgroup index or the stage
//       warp-uniform; both now come through a shuffle from lane 0. The library's v8, three rounds
//       against the build before: batch 1 / 8192 / d128 592 -> 622 TFLOP/s, batch 4 / 2048
//       447 -> 464, d64 and d256 4-9% faster, fp8 pools 2-4%.
//
// Measured: H100 80GB HBM3, 2026-11-22/23, 32 query heads, 8 KV heads, head dim 128, page 16,
// bf16, causal, cold L2, median of 10 (TFLOP/s; torch flash-attention 2: 206-356, cuDNN:
// 411-647; FlashAttention-3 in the issue: 362-565):
//                        v1     v2 (64 rows, 4 warps)   v2 (128 rows, 8 warps, heaviest first)
//   batch 1 len 2048   10.4      90.5                   104.0
//   batch 1 len 8192   11.0     120.1                   137.8
//   batch 4 len 2048   10.5     110.0                   125.0
//   batch 4 len 8192   10.9     127.2                   140.7
// The Hopper kernel, step by step (batch 1, length 8192; v3 / v4):
//   first correct version (two stages, block table read by one lane)       140.9 /     -
//   block-table reads spread over the producer's lanes, one tile ahead      141.7 / 135.6
//   soft-cap and mask branches out of the element loops, scale folded into
//   one FMA, P packed by cvt.rn.bf16x2 (d64 had been as slow as d128)         453.6 / 428.5
//   three stages up to d128 and ex2.approx.ftz (v4, through bench attention)      - / 440.2
// v3 / v4 at the sweep's shapes (two-stage version): 1x2048 286.9 / 272.3, 4x2048 351.2 / 335.8,
// 4x8192 459.0 / 421.9, 1x32768 474.7 / 459.0, 32/32 heads 424.4 / 411.5, d64 316.5 / 295.3,
// d256 482.6 / 483.2 (d256 always runs v3: the overlapped loop spills there).
// Small pages (2026-11-25; TFLOP/s at batch 1, length 8192, d128; v3 / v4 / v5), with one warp
// issuing every K and V copy (three calls):
//   page 16    465-476 / 439-449 / 428-431   (every page-16 shape: v3 2-8% ahead of v4)
//   page 32    529-531 / 525-527 / 431
//   page 64    522-527 / 548-556 / 427-431
//   page 128   531-533 / 555-556 / 429-433
// v5's first version waited on its own copies one tile behind (177); with a division by the page
// size per copied row the consumers waited on K 39% of their samples (183); one offset per lane
// and tile passed by shuffles: 428. Gathering V alone (K by tensor copies): 387 overlapped, 399
// serial. At page 16 a tile is 32 bulk copies of 2 KiB, and one warp issued them all: with K
// issued by warp 0 and V by warp 1 (the library since),
//   page 16    515-517 / 527 / 425-428   (4 x 8192: 525-531 / 470-496; 1 x 32768: 511-519 /
//                                          534-538; d256: 590-601)
//   page 32    518-528 / 536-544,  page 64  513-524 / 545-556,  page 128  515-523 / 536-563
// Four issuing warps (two per tile, a column block each) were no faster than two.
// Ping-pong and the work order (2026-11-26; H100, page 16, d128; versions timed side by side in
// rotated rounds: timed one after the other, the first version gained up to 10% from the clocks
// of a rested GPU). v4 / v6 / v7, and v4 as it was before the change, built from the previous
// main and run alternately in the same call:
//   batch 1 len 2048    306 / 340 / 374-378   (before: 318-322)
//   batch 1 len 8192    498-503 / ~499 / 550-554   (519-528)
//   batch 4 len 8192    508 / ~476 / 519-531   (523-534)
//   batch 1 len 32768   517 / ~510 / 552-556   (530-538)
//   d64, batch 1 8192   326-330 / 326-330 / 343-351   (343-347)
// A first persistent grid (2026-11-26, removed then: one CTA per SM looping over works dealt in
// static rounds, Q reloaded behind an empty barrier, stages and phases running on across works):
// 396-402 at batch 4 / 2048 (v7 367-377) but 2-10% slower elsewhere, and its per-work loop
// spilled registers. In that version, divisions by the GQA group inside the per-tile range scan
// had cost 9-13% until hoisted. v8 (2026-11-27, H100, three rotated rounds against v7 in one
// binary, TFLOP/s v7 / v8): the works taken from a counter (as the hardware hands out CTAs), the
// consumers' per-work state without spills (the rows' positions computed where a mask or the
// store needs them):
//   batch 1 len 2048    358 / 381        batch 4 len 2048    376 / 410
//   batch 1 len 8192    526 / 541        batch 4 len 8192    504 / 521
//   batch 1 len 32768   529 / 538        batch 4 len 32768   510 / 526
//   32/32 heads         526 / 539        d64 (batch 1 / 4)   338 / 351, 343 / 355
//   d256 (batch 1 / 4)  520 / 556, 535 / 536
//   pages 32 / 64 / 128 507 / 552, 504 / 551, 525 / 557
// A static deal in snake order (round r forwards, r + 1 backwards; another call) gave 380 / 543 /
// 407 / 502 / 534 at the first five of those shapes; the counter is kept because a static deal
// leaves CTAs' totals apart wherever the works do not fall evenly over a round.
// Publishing each work's geometry from thread 0 (instead of every role reading the item,
// q_indptr and kv_len itself) was 6-30% slower (the attention benchmark, two builds).
// v8's work boundaries (2026-11-27, H100; LAB_PREFILL_TRACE below, with the library built with
// -DPAGEDATTN_PREFILL_TRACE=ON): at batch 4 / 2048 a work ended with 2.0 us of stores and 0.9 us
// to take the next one, and began with 0.06 us a tile to find the tiles each warpgroup sees. The
// library's v8 now finds them in closed form, takes the next work's index and geometry before the
// stores, and sorts its works by whole 128-key tiles (the four tiles of a 128-query chunk ran a
// batch apart, reading their K/V from memory four times). The attention benchmark, three rounds
// against the build before: TFLOP/s batch 1 / 2048 395 -> 411, batch 1 / 8192 572 -> 591, batch
// 4 / 2048 429 -> 448, batch 4 / 8192 level; 64 prompts of 512 1.08x, chunks of 128 queries at
// the end of 512-2048 positions 1.08-1.38x (docs/BENCHMARKS.md, 2026-11-27).
// Nor (2026-11-26, H100, lab, five rotated rounds against v7 in one binary): each CTA, once its
// loads were issued, prefetching into L2 the Q tile of the work an SM count on (the one likely to
// start as it ends): 1.0-2.4% faster at batch 4 / 2048, batch 1 / 32768 and d64, 2-10% slower at
// batch 1 / 8192 (32 KV heads: 1004 -> 1104 us) and pages 64-128.
// Nor (same day, the attention benchmark, two builds alternating): 240 registers for the bf16
// consumers and 24 for the tensor-copy producer (which then spilled 16-20 bytes): d64 1% faster,
// d128 and d256 within -2% / +4% of before.
// fp8 pools (the sweep's fp8 rows; v1 and v2 run their prefill rows on the decode kernel, v3 on
// the Hopper kernel since 2026-11-26), batch 1 / length 8192 / d128, v2 / v7: 31 / 225 with one
// staging tile per side and a conversion to bf16 through f32; 240 with two staging tiles; 307
// converting 16 values a step; 346 with the products in f16 (one conversion instruction a pair).
// Tried and not kept: 64-key tiles in five stages for fp8 pools, 282 (batch 4: 283; d64: 200).
// Nor (2026-11-26, the attention benchmark, two builds alternating): the producer's e4m3 -> f16
// without the conversion unit (a byte permute replicating each sign, a shift, a mask, a product
// by 256 in f16; exact for every finite value): fp8 rows 8-20% slower (batch 1 / 8192: 1732-1755
// -> 1858-2099 us), so the conversion instruction is not what bounds them.
// The producer's instructions do (2026-11-26, H100, the attention benchmark, each change against
// the build before it, alternating, fp8 rows, us at batch 1 / 8192 / d128; bf16 985-993): every
// offset of a thread's 16-value pieces fixed (rows r0 + RS j of one column), 35 instructions a
// piece -> 15, 1588 -> 1182; the second pair of each word converted from the register's high half
// (no shift) and 56 registers for the serial loop's producers (they had spilled at 40), 1179 ->
// 1137. Half of each piece through integer operations instead (to share the work between two
// pipes): 3-7% slower. Nsight Compute at 1137: tensor pipe 50.8% of the cycles against bf16's
// 59.1%, 2.92 warps active a scheduler against 2.44 (the converting producer warps), the same
// 41% of issue slots busy. Then the online softmax's lazy maximum (from head dim 128; the
// library and every version): fp8 1-6% faster, bf16 level at d128 and 2-3% faster at d256; d64
// was 3-5.5% slower and keeps rescaling every tile.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "lab_common.h"

namespace {

using namespace pagedattn;

// LAB_PREFILL_TRACE (below): the buffer v8 records its works' timeline into.
void* g_trace = nullptr;

std::function<void()> make_version(int v, const lab::Problem& p,
                                   std::unique_ptr<CudaAttentionPlan>& plan) {
  CudaPlanOptions o;
  if (v == 8) o.prefill_trace = g_trace;
  o.tensor_core_prefill = v >= 2;
  o.hopper_prefill = v >= 3;
  o.hopper_prefill_overlap = v >= 4;
  o.hopper_gather = v == 5;
  o.hopper_head_section = v >= 6 ? -1 : 1;
  o.hopper_pingpong = v >= 7;
  o.hopper_ctas = v >= 8 ? -1 : 0;
  plan = std::make_unique<CudaAttentionPlan>(size_t(256) << 20, o);
  plan->plan(p.dev_q(), p.dev_view(), p.batch(), p.s.opt, p.dev_out());
  return [&p, &plan] {
    QKVTensor out = p.dev_out();
    paged_attention_cuda(*plan, p.dev_q(), p.dev_view(), out);
  };
}

// LAB_PREFILL_TRACE=batch:len[:chunk[:d]] (d128 by default, 32 query / 8 KV heads, page 16,
// bf16): v8's timeline on that shape (CudaPlanOptions::prefill_trace), read from one launch after
// warm-up: where a CTA's time goes between and inside its works, by the works' KV tiles. Needs
// the library built with -DPAGEDATTN_PREFILL_TRACE=ON (else nothing is recorded: said so).
int trace_shape(const char* spec) {
  int batch = 0, len = 0, chunk = 0, d = 128;
  if (std::sscanf(spec, "%d:%d:%d:%d", &batch, &len, &chunk, &d) < 2 || batch < 1 || len < 1) {
    std::fprintf(stderr, "LAB_PREFILL_TRACE: want batch:len[:chunk[:d]], got %s\n", spec);
    return 1;
  }
  if (chunk <= 0 || chunk > len) chunk = len;
  lab::Shape s;
  s.hq = 32;
  s.hkv = 8;
  s.d = d;
  s.page = 16;
  s.q_len.assign(size_t(batch), chunk);
  s.kv_len.assign(size_t(batch), len);
  lab::Problem p(s, 5, false);
  constexpr int E = 8;
  const size_t max_works = size_t(batch) * s.hkv * ((chunk * (s.hq / s.hkv) + 127) / 128);
  lab::ck(cudaMalloc(&g_trace, max_works * E * 8), "trace buffer");
  std::unique_ptr<CudaAttentionPlan> plan;
  std::function<void()> run = make_version(8, p, plan);
  for (int i = 0; i < 3; ++i) run();
  lab::ck(cudaMemset(g_trace, 0, max_works * E * 8), "trace clear");
  run();
  lab::ck(cudaDeviceSynchronize(), "traced launch");
  std::vector<uint64_t> t(max_works * E);
  lab::ck(cudaMemcpy(t.data(), g_trace, t.size() * 8, cudaMemcpyDeviceToHost), "trace copy");
  cudaFree(g_trace);
  g_trace = nullptr;
  // Each CTA's works in its order.
  struct W {
    const uint64_t* e;
    int k, tiles;
  };
  std::map<int, std::vector<W>> ctas;
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (size_t w = 0; w < max_works; ++w) {
    const uint64_t* e = &t[w * E];
    if (e[0] == 0 || e[4] == 0 || e[5] == 0 || e[7] == 0) continue;
    ctas[int(e[7] >> 32)].push_back({e, int((e[7] >> 16) & 0xffff), int(e[7] & 0xffff)});
    t0 = std::min({t0, e[0], e[6]});
    t1 = std::max({t1, e[4], e[5]});
  }
  // Phases: take (the last rows stored to the work started), Q wait, first S, the rest of the
  // tiles, the next work's index in hand, the stores; and the producer's Q issue to the Q found
  // landed.
  const char* names[] = {"take", "q_wait", "first_s", "tiles", "next", "store",
                         "q_issue_to_landed"};
  constexpr int NP = 7;
  std::map<int, std::vector<std::vector<double>>> by_tiles;
  double sums[NP] = {}, span_sum = 0;
  int works = 0;
  for (auto& [cta, ws] : ctas) {
    std::sort(ws.begin(), ws.end(), [](const W& a, const W& b) { return a.k < b.k; });
    uint64_t prev_end = t0;
    for (const W& w : ws) {
      const uint64_t* e = w.e;
      double ph[NP] = {double(e[0] - prev_end), double(e[1] - e[0]), double(e[2] - e[1]),
                       double(e[3] - e[2]),       double(e[5] - e[3]), double(e[4] - e[5]),
                       double(e[1]) - double(e[6])};
      auto& v = by_tiles[w.tiles];
      if (v.empty()) v.resize(NP);
      for (int k = 0; k < NP; ++k) {
        v[size_t(k)].push_back(ph[k] / 1e3);
        sums[k] += ph[k] / 1e3;
      }
      prev_end = e[4];
      ++works;
    }
    span_sum += double(prev_end - t0) / 1e3;
  }
  if (ctas.empty()) {
    std::printf("== trace: nothing recorded (build with -DPAGEDATTN_PREFILL_TRACE=ON)\n");
    return 1;
  }
  const double n = double(ctas.size());
  std::printf("== trace: batch %d, len %d, chunk %d, d%d: %d works on %zu CTAs, first take to last "
              "store %.1f us\n", batch, len, chunk, d, works, ctas.size(), double(t1 - t0) / 1e3);
  std::printf("a CTA's time (mean over CTAs, us):");
  for (int k = 0; k < NP - 1; ++k) std::printf(" %s %.1f", names[k], sums[k] / n);
  std::printf(" | span %.1f\n", span_sum / n);
  std::printf("%-6s %-6s", "tiles", "works");
  for (int k = 0; k < NP; ++k) std::printf(" %18s", names[k]);
  std::printf("   (median/mean us)\n");
  for (auto& [tiles, v] : by_tiles) {
    std::printf("%-6d %-6zu", tiles, v[0].size());
    for (int k = 0; k < NP; ++k) {
      std::vector<double>& x = v[size_t(k)];
      double mean = 0;
      for (double y : x) mean += y;
      std::sort(x.begin(), x.end());
      std::printf("      %6.2f/%6.2f", x[x.size() / 2], mean / double(x.size()));
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main() {
  if (const char* spec = std::getenv("LAB_PREFILL_TRACE")) return trace_shape(spec);
  constexpr int kVersions = 8;
  int failures = 0;
  std::printf("== correctness gate (relative L2 error vs the double-precision reference)\n");
  for (DType kv : {DType::bf16, DType::fp8_e4m3})
    for (int d : {64, 128, 256})
      for (int hkv : {4, 1}) {
        lab::Shape s;
        s.hq = 8;
        s.hkv = hkv;
        s.d = d;
        s.kv = kv;
        s.page = 16;
        s.q_len = {200, 1, 77, 130};
        s.kv_len = {200, 900, 300, 131};  // full prefill, decode, two chunked prefills
        s.opt.window = d == 64 ? 100 : 0;
        lab::Problem p(s, uint64_t(d * 7 + hkv));
        for (int v = 1; v <= kVersions; ++v) {
          std::unique_ptr<CudaAttentionPlan> plan;
          const double err = p.check(make_version(v, p, plan));
          const bool ok = err <= 1e-2;
          failures += !ok;
          std::printf("gate v%d kv=%s d=%d hkv=%d tensor_core=%d hopper=%d err=%.2e %s\n", v,
                      std::string(dtype_name(kv)).c_str(), d, hkv, plan->info().prefill_tiles > 0,
                      int(plan->info().prefill_hopper), err, ok ? "ok" : "FAIL");
        }
      }

  // LAB_VERSIONS=4,6,7: time only those versions (the gate checks every one); LAB_SHAPES=0,1:
  // only those rows of the sweep; LAB_ROUNDS (default 3): rounds of the interleaved timing.
  auto in_list = [](const char* env, int x) {
    const char* v = std::getenv(env);
    if (!v) return true;
    const std::string list = std::string(",") + v + ",";
    return list.find("," + std::to_string(x) + ",") != std::string::npos;
  };
  auto timed = [&](int v) { return in_list("LAB_VERSIONS", v); };
  const int rounds = std::getenv("LAB_ROUNDS") ? std::max(1, std::atoi(std::getenv("LAB_ROUNDS"))) : 3;
  std::printf(
      "== timing sweep (page 16 unless said, causal; TFLOP/s counting the causal half; v1 only "
      "up to length 2048)\n");
  std::printf("%-6s %-6s %-4s %-4s %-4s %-4s %-5s", "batch", "len", "hq", "hkv", "d", "page", "kv");
  for (int v = 1; v <= kVersions; ++v) std::printf(" %8s%d_us", "v", v);
  for (int v = 1; v <= kVersions; ++v) std::printf(" %5s%d_TF", "v", v);
  std::printf("\n");
  struct Sweep {
    int batch, len, hq, hkv, d, page = 16;
    DType kv = DType::bf16;
  };
  const Sweep sweep[] = {
      {1, 2048, 32, 8, 128},     {1, 8192, 32, 8, 128},     {4, 2048, 32, 8, 128},
      {4, 8192, 32, 8, 128},     {1, 32768, 32, 8, 128},    {1, 8192, 32, 32, 128},
      {1, 8192, 32, 8, 64},      {1, 8192, 32, 8, 256},     {4, 8192, 32, 8, 64},
      {4, 8192, 32, 8, 256},     {1, 8192, 32, 8, 128, 32}, {1, 8192, 32, 8, 128, 64},
      {1, 8192, 32, 8, 128, 128}, {4, 32768, 32, 8, 128},
      // fp8 pools: v1/v2 run their prefill rows on the decode kernel, v3 on the Hopper kernel.
      {1, 2048, 32, 8, 128, 16, DType::fp8_e4m3}, {1, 8192, 32, 8, 128, 16, DType::fp8_e4m3},
      {4, 8192, 32, 8, 128, 16, DType::fp8_e4m3}, {1, 8192, 32, 8, 64, 16, DType::fp8_e4m3}};
  int row = -1;
  for (const Sweep& w : sweep) {
    if (!in_list("LAB_SHAPES", ++row)) continue;
    lab::Shape s;
    s.hq = w.hq;
    s.hkv = w.hkv;
    s.d = w.d;
    s.page = w.page;
    s.kv = w.kv;
    s.q_len.assign(size_t(w.batch), w.len);
    s.kv_len.assign(size_t(w.batch), w.len);
    lab::Problem p(s, 3, false);
    double us[kVersions + 1] = {};
    std::unique_ptr<CudaAttentionPlan> plans[kVersions + 1];
    std::vector<std::function<void()>> runs;
    std::vector<int> which;
    for (int v = 1; v <= kVersions; ++v) {
      if (!timed(v) || (v == 1 && w.len > 2048)) continue;
      runs.push_back(make_version(v, p, plans[v]));
      which.push_back(v);
    }
    // v1 is slow: one round of three runs; the others rotate over `rounds` rounds.
    if (!which.empty() && which[0] == 1) {
      us[1] = lab::time_us(runs[0], 3);
      runs.erase(runs.begin());
      which.erase(which.begin());
    }
    const std::vector<double> med = lab::time_us_interleaved(runs, rounds, 10);
    for (size_t k = 0; k < which.size(); ++k) us[which[k]] = med[k];
    const double flops = 4.0 * w.batch * s.hq * s.d * (double(w.len) * (w.len + 1) / 2);
    auto tf = [&](double t) { return t > 0 ? flops / t / 1e6 : 0.0; };
    std::printf("%-6d %-6d %-4d %-4d %-4d %-4d %-5s", w.batch, w.len, w.hq, w.hkv, w.d, w.page,
                std::string(dtype_name(w.kv)).c_str());
    for (int v = 1; v <= kVersions; ++v) std::printf(" %12.1f", us[v]);
    for (int v = 1; v <= kVersions; ++v) std::printf(" %9.1f", tf(us[v]));
    std::printf("\n");
  }
  std::printf("gate: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}
