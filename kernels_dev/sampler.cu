// Kernel lab: the device sampler of sampled decode steps (src/model/cuda/sampling_kernels.h) on
// rows of a 128K vocabulary, split over clusters of 1 to 8 CTAs a row, beside the greedy step's
// argmax.
//
//   sampler_lab            gate, then the sweep
//   sampler_lab --json     the sweep's results as one JSON object per line as well
//
// Versions: cluster 1, one CTA a row reading the row twice (the sampler before clusters); 2, 4,
// 8: the two passes split over that many CTAs, gathering into the first one's shared memory (the
// library's default is one CTA per 65536 logits: 2 here). Then rows as OpenAI's API sends them
// (top-p without top-k) at the default: with a few likely tokens, and flat (a top-p set past the
// candidate list: the whole-row path, one CTA a row).
// Rows: the sampled mix of a serving step (temperature 0.8, top-k 50, top-p 0.95, repetition
// penalty 1.1, 5 log-probabilities) with 550 edits each (a 512-token prompt's distinct tokens
// and a few generated ones); logits normal with a few large ones, like a model's.
// Gate: every cluster size gives the tokens and top ids of the host twin (sample_plan.h), the
// log-probabilities within 1e-4 of it, and the logits back unchanged (top-p rows: the tokens).
// Timing: CUDA events, medians of 30, with the logits in L2 (as the LM head leaves them; ten
// launches back to back a timing) and after an L2 flush (one launch); GB/s: the two passes'
// reads of the rows, beside the copy rate.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cuda_bandwidth.h"
#include "lab_common.h"
#include "llama_kernels.h"
#include "sampler_host.h"
#include "sampling_kernels.h"

namespace {

using namespace pagedattn;

constexpr int32_t kVocab = 128256, kTop = 5;

// A batch on the device: the rows, their descriptions and edits, the sampler's outputs.
struct Batch {
  lab::SamplerBatch h;
  float* d_logits = nullptr;
  cuda::SampleRowDesc* d_desc = nullptr;
  cuda::SampleEdit* d_edits = nullptr;
  float *d_saved = nullptr, *d_lp = nullptr, *d_top_lp = nullptr;
  int32_t *d_ids = nullptr, *d_top = nullptr;

  Batch(int32_t R, uint64_t seed, bool top_p_only = false, bool flat = false)
      : h(lab::make_sampler_batch(R, kVocab, seed, top_p_only, flat)) {
    const size_t E = h.edits.size();
    lab::ck(cudaMalloc(&d_logits, h.logits.size() * 4), "malloc");
    lab::ck(cudaMalloc(&d_desc, h.desc.size() * sizeof(h.desc[0])), "malloc");
    lab::ck(cudaMalloc(&d_edits, E * sizeof(cuda::SampleEdit)), "malloc");
    lab::ck(cudaMalloc(&d_saved, E * 4), "malloc");
    lab::ck(cudaMalloc(&d_lp, size_t(R) * 4), "malloc");
    lab::ck(cudaMalloc(&d_top_lp, size_t(R) * kTop * 4), "malloc");
    lab::ck(cudaMalloc(&d_ids, size_t(R) * 4), "malloc");
    lab::ck(cudaMalloc(&d_top, size_t(R) * kTop * 4), "malloc");
    lab::ck(cudaMemcpy(d_logits, h.logits.data(), h.logits.size() * 4, cudaMemcpyHostToDevice),
            "upload");
    lab::ck(cudaMemcpy(d_desc, h.desc.data(), h.desc.size() * sizeof(h.desc[0]),
                       cudaMemcpyHostToDevice),
            "upload");
    lab::ck(cudaMemcpy(d_edits, h.edits.data(), E * sizeof(h.edits[0]), cudaMemcpyHostToDevice),
            "upload");
  }
  ~Batch() {
    for (void* p : {(void*)d_logits, (void*)d_desc, (void*)d_edits, (void*)d_saved, (void*)d_lp,
                    (void*)d_top_lp, (void*)d_ids, (void*)d_top})
      cudaFree(p);
  }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  void sample(int32_t cluster) const {
    cuda::sample_rows(d_logits, h.rows, kVocab, d_desc, d_edits, d_saved, d_ids, d_lp, d_top,
                      d_top_lp, kTop, nullptr, cluster);
  }
  void argmax() const { cuda::argmax_rows(d_logits, h.rows, kVocab, d_ids, nullptr); }
};

// Median microseconds a launch over 30 timings of 10 back-to-back launches (after 5 warm ones),
// the data left in L2 between them: the host's launch time hidden, as in a step.
double time_warm_us(const std::function<void()>& run) {
  cudaEvent_t a, b;
  lab::ck(cudaEventCreate(&a), "event");
  lab::ck(cudaEventCreate(&b), "event");
  for (int i = 0; i < 5; ++i) run();
  std::vector<double> t;
  for (int i = 0; i < 30; ++i) {
    lab::ck(cudaEventRecord(a), "record");
    for (int k = 0; k < 10; ++k) run();
    lab::ck(cudaEventRecord(b), "record");
    lab::ck(cudaEventSynchronize(b), "sync");
    float ms = 0;
    lab::ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms * 1e3 / 10);
  }
  lab::ck(cudaGetLastError(), "timed runs");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class T>
std::vector<T> download(const T* p, size_t n) {
  std::vector<T> v(n);
  lab::ck(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return v;
}

// Every cluster size against the host twin on one batch; returns the differences.
int gate(int32_t R, uint64_t seed, bool top_p_only = false, bool flat = false) {
  Batch b(R, seed, top_p_only, flat);
  const lab::SamplerPicks host = lab::host_picks(b.h, kTop);
  int failures = 0;
  for (int32_t cluster : {1, 2, 3, 4, 8}) {
    b.sample(cluster);
    lab::ck(cudaDeviceSynchronize(), "sample");
    const auto ids = download(b.d_ids, size_t(R)), top = download(b.d_top, size_t(R) * kTop);
    const auto lp = download(b.d_lp, size_t(R));
    const auto top_lp = download(b.d_top_lp, size_t(R) * kTop);
    int bad = download(b.d_logits, b.h.logits.size()) == b.h.logits ? 0 : 1;
    for (size_t i = 0; i < size_t(R); ++i) {
      bad += ids[i] != host.ids[i];
      if (top_p_only) continue;  // no log-probabilities asked
      bad += std::fabs(lp[i] - host.logprob[i]) > 1e-4f;
      for (size_t j = i * kTop; j < (i + 1) * kTop; ++j)
        bad += top[j] != host.top[j] || std::fabs(top_lp[j] - host.top_logprob[j]) > 1e-4f;
    }
    std::printf("gate rows %2d cluster %d%s: %s (%d differences)\n", R, cluster,
                top_p_only ? " top-p" : "", bad ? "FAILED" : "ok", bad);
    failures += bad;
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::string(argv[1]) == "--json";
  int failures = 0;
  for (int32_t R : {1, 7, 32}) failures += gate(R, uint64_t(R) * 31 + 5);
  failures += gate(32, 11, /*top_p_only=*/true);
  failures += gate(8, 12, /*top_p_only=*/true, /*flat=*/true);
  std::printf("gate: %s (%d failures)\n", failures ? "FAILED" : "ok", failures);
  if (failures) return 1;
  const pagedattn::bench::CopyBandwidth copy = pagedattn::bench::measure_copy_bandwidth();
  std::printf("== timing (%s, copy %.0f GB/s; median of 30; GB/s: two reads of the rows)\n",
              copy.device.c_str(), copy.gbps);
  std::printf("%4s %8s | %9s %9s %9s %9s %9s | %9s %9s (cold L2)\n", "rows", "kernel",
              "us warm", "GB/s", "", "", "", "us cold", "GB/s");
  for (int32_t R : {1, 8, 16, 32, 64}) {
    Batch b(R, 7);
    const double bytes = 2.0 * double(R) * kVocab * 4;
    auto report = [&](const char* kernel, int cluster, const std::function<void()>& run,
                      double read) {
      const double warm = time_warm_us(run), cold = lab::time_us(run, 30);
      std::printf("%4d %8s | %9.1f %9.0f %29s | %9.1f %9.0f\n", R, kernel, warm, read / warm / 1e3,
                  "", cold, read / cold / 1e3);
      if (json)
        std::printf("{\"lab\":\"sampler\",\"device\":\"%s\",\"rows\":%d,\"vocab\":%d,"
                    "\"kernel\":\"%s\",\"cluster\":%d,\"us_warm\":%.2f,\"us_cold\":%.2f,"
                    "\"copy_gbps\":%.0f}\n",
                    copy.device.c_str(), R, kVocab, kernel, cluster, warm, cold, copy.gbps);
    };
    report("argmax", 0, [&] { b.argmax(); }, bytes / 2);
    for (int32_t cluster : {1, 2, 4, 8}) {
      const std::string name = "mix c" + std::to_string(cluster);
      report(name.c_str(), cluster, [&] { b.sample(cluster); }, bytes);
    }
    Batch p(R, 9, /*top_p_only=*/true), f(R, 9, true, /*flat=*/true);
    report("top-p", 0, [&] { p.sample(0); }, bytes);
    report("top-p fl", 0, [&] { f.sample(0); }, bytes);
  }
  return 0;
}
