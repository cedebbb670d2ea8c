// The model runner interface the engine drives: one forward pass over a ragged batch.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/paged_kv.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/model_file.h"
#include "pagedattn/sample_plan.h"
#include "pagedattn/tensor.h"

namespace pagedattn {

class Tokenizer;

// One step's batch, built once by the scheduler (a calibration pass builds its own) and trusted by
// the runners. Sequence b's new tokens are rows q_indptr[b] .. q_indptr[b+1] of
// tokens/positions/slots; the cache already holds their slots (KvCache::append_slots), and the
// attention layout (kv_len, padded block tables) is the cache's as it stands after those appends
// (set_attention_layout). A runner reads nothing else of the cache's bookkeeping, only its pools:
// so a tensor-parallel worker, whose cache has no sequences, runs the leader's batch as it is.
struct ForwardBatch {
  std::vector<SeqId> seqs;          // [num_seqs]
  std::vector<int32_t> q_indptr;    // [num_seqs + 1]
  std::vector<int32_t> tokens;      // [num_tokens]
  std::vector<int32_t> positions;   // [num_tokens]
  std::vector<int32_t> slots;       // [num_tokens]
  std::vector<int32_t> logit_rows;  // token rows whose logits are wanted (usually each seq's last)
  std::vector<int32_t> kv_len;       // [num_seqs] tokens in the cache, the new ones included
  std::vector<int32_t> block_table;  // [num_seqs, max_pages] page ids, padded with 0
  int32_t max_pages = 0;             // >= 1 once the layout is set
};

// Fills batch.kv_len / block_table / max_pages from the cache (after append_slots). Error when a
// sequence of the batch is not in the cache.
void set_attention_layout(ForwardBatch& batch, const KvCache& cache);
// The batch's layout as the attention operator takes it (pointers into the batch).
BatchLayout attention_layout(const ForwardBatch& batch);
// Checks a batch on its own and against a cache of page_size x num_pages and a model of vocab_size:
// index arrays consistent, tokens in the vocabulary, positions kv_len - q_len + j, slots where the
// block table puts those positions, page ids inside the pool. Error messages start with `op`.
// chained_rows > 0: a token may also be -(r + 1) for r < chained_rows, the id that the greedy pass
// begun before this batch picks for its logit row r (Model::begin_greedy).
void check_forward_batch(const ForwardBatch& batch, int32_t vocab_size, int32_t page_size,
                         int32_t num_pages, const char* op, int32_t chained_rows = 0);
// The stand-in for the id that the pass begun before picks for its logit row r.
constexpr int32_t chained_token(int32_t r) { return -(r + 1); }

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Device device() const = 0;
  // Runs every layer over the batch, writing the new tokens' K/V into the cache.
  // Returns logits [logit_rows.size(), vocab_size] as f32 on the CPU.
  virtual Tensor forward(const ForwardBatch& batch, KvCache& cache) = 0;
  // The same pass for a greedy step: per logit row, the argmax of its logits (sampling.h's argmax:
  // lowest id on ties, NaN never wins) [logit_rows.size()]. The default runs forward() and takes
  // the argmax on the host; a device runner overrides it to pick the ids where the logits are and
  // download only those.
  virtual std::vector<int32_t> forward_greedy(const ForwardBatch& batch, KvCache& cache);
  // The same pass, each logit row's token picked by plan.rows[row] (sample_plan.h: penalties,
  // bias, temperature, top-k/p, min-p, the seeded draw, log-probabilities). The default runs
  // forward() and sample_rows() on the host; a device runner samples where the logits are and
  // downloads only the ids and the asked log-probabilities. Error (before anything runs) for a
  // plan that does not fit the batch or the vocabulary.
  virtual std::vector<TokenLogprobs> forward_sample(const ForwardBatch& batch, KvCache& cache,
                                                    const SamplePlan& plan);
  // Passes in two calls, so that a caller can go on while a device runs them: begin_greedy or
  // begin_sample starts a pass (at most two are open, finished in the order begun);
  // finish_greedy returns the ids of the oldest open pass (a greedy one). A sampled pass's tokens
  // are picked by a plan (sample_plan.h), which the caller may build while the pass runs:
  // pick_sampled(plan) checks the plan and starts the picking of the oldest open sampled pass,
  // take_sampled returns what forward_sample would; finish_sample(plan) is the two in a row. A
  // plan that does not fit fails pick_sampled after the pass has written the batch's K/V (the
  // positions the batch adds, which a caller commits only when the step succeeds).
  // A batch begun while another pass is open (a greedy one, or a sampled one already picked) may
  // take that pass's picks as its tokens: chained_token(r) stands for the id it picks for its logit
  // row r (the engine schedules a step ahead with them). The default keeps a copy of each batch
  // (the cache must stay as it is until the pass is finished) and runs forward_greedy or
  // forward_sample in finish_greedy / take_sampled; a device runner enqueues the pass in begin_*
  // and the picks never come back to the host between two passes. An error from finish_greedy,
  // pick_sampled or take_sampled drops every open pass.
  virtual void begin_greedy(const ForwardBatch& batch, KvCache& cache);
  virtual std::vector<int32_t> finish_greedy();
  virtual void begin_sample(const ForwardBatch& batch, KvCache& cache);
  virtual void pick_sampled(const SamplePlan& plan);
  virtual std::vector<TokenLogprobs> take_sampled();
  std::vector<TokenLogprobs> finish_sample(const SamplePlan& plan) {
    pick_sampled(plan);
    return take_sampled();
  }
  // Whether begin_* return while the pass runs (a device runner), so that the caller's work until
  // the pass is finished overlaps it: the engine schedules ahead by default only then.
  virtual bool overlaps_passes() const { return false; }
  // Whether a pass may take a sampled pass's picks as its tokens (a tensor-parallel group picks on
  // rank 0 alone: its other ranks never see them).
  virtual bool chains_after_sampled() const { return true; }
  // The absolute maximum of K (as stored: after norm and RoPE) and V per layer and KV head over
  // `tokens` run as one fresh sequence (on a private cache): k, v [num_layers * num_kv_heads].
  // The calibration pass behind fp8 KV scales. Runners that cannot do it throw Error.
  struct KvAbsMax {
    std::vector<float> k, v;
  };
  virtual KvAbsMax kv_absmax(const std::vector<int32_t>& tokens);
  // Told by calibrate_kv_scales, once it has set the cache's scales from kv_absmax with
  // `headroom`: a runner whose other ranks keep caches of their own (tensor parallelism: each
  // rank's KV heads, its kv_absmax the calibration pass of every rank at once) has them set theirs
  // from their own maxima the same way. Others ignore it.
  virtual void kv_scales_calibrated(float /*headroom*/) {}
  // CPU: f32 activations against the dequantised weights instead of int8 activation blocks
  // (slower, no activation rounding). Runners without that choice ignore it.
  virtual void set_exact_matmul(bool) {}
  // The cache this runner needs, from the engine's choice: a tensor-parallel runner keeps only its
  // rank's KV heads and asks for a log of page copies to replay on the other ranks.
  virtual void adapt_cache_config(KvCacheConfig&) const {}
  // Seconds the device has spent on this runner's forward steps so far, each from its first upload
  // to its results' download (what is left of the wall time is the device idling between steps,
  // for the host's work); -1 where the runner does not measure it (the CPU).
  virtual double device_busy_seconds() const { return -1; }
  // CUDA graphs so far: of decode steps, how many were captured and how many steps replayed one;
  // of the device sampler (its launch and download), the same; -1 where the runner has none (the
  // CPU).
  struct GraphStats {
    int64_t captures = -1;
    int64_t replays = -1;
    int64_t sampler_captures = -1;
    int64_t sampler_replays = -1;
  };
  virtual GraphStats cuda_graph_stats() const { return {}; }
  // Empty while the runner can run; else why it cannot (a tensor-parallel rank has failed).
  // Callable from any thread.
  virtual std::string health() const { return ""; }

 private:
  // The default's open passes (oldest first) and the picks of the last one finished.
  struct OpenPass {
    ForwardBatch batch;
    KvCache* cache = nullptr;
    bool sampled = false;
    bool picked = false;  // sampled: pick_sampled has its plan
    SamplePlan plan;
  };
  void begin_pass(const ForwardBatch& batch, KvCache& cache, bool sampled, const char* op);
  // The oldest open pass, its stand-ins replaced by the picks of the pass before it.
  OpenPass take_oldest(bool sampled, const char* op);
  std::deque<OpenPass> open_passes_;
  std::vector<int32_t> last_picks_;
};

// A short built-in English text for the fp8 calibration pass.
std::string_view kv_calibration_text();
// The calibration pass's tokens: the text through the tokenizer, or without one (a synthetic model)
// a fixed pseudo-random stream of 256 ids below vocab_size.
std::vector<int32_t> kv_calibration_tokens(const Tokenizer* tokenizer, int32_t vocab_size);
// fp8 caches: sets every layer's scales from model.kv_absmax(tokens), scale = absmax * headroom /
// 448 (the e4m3 maximum), so values up to headroom x the calibration maximum are representable.
void calibrate_kv_scales(Model& model, KvCache& cache, const std::vector<int32_t>& tokens,
                         float headroom = 1.25f);

// The runner for a loaded model file on `device`: the Llama family (llama, mistral, qwen2, qwen3).
// Throws Error for an architecture or device that has no forward path.
std::unique_ptr<Model> create_model(const ModelFile& file, Device device);

// How load_model_file should keep a file's matrices for the runner on `device`: the CPU runner
// reads the file's own blocks in place (memory-mapped); CUDA reads a folder's tensors in their
// stored dtype, mapped (GGUF dequantised to f32), and uploads them as bf16.
WeightFormat weight_format_for(Device device);

}  // namespace pagedattn
