// Tensor parallelism (Megatron-style): each of `world` GPUs holds a slice of every layer, one
// process per GPU, NCCL between them.
//
//   column-parallel (rows of [out, in] split): q/k/v by heads, gate/up by intermediate rows,
//     embed_tokens and lm_head by vocabulary rows;
//   row-parallel (columns split): o_proj by the q heads' columns, down_proj by intermediate cols;
//   replicated: norms, q/k norms.
// Rank r holds num_q_heads / world q heads and num_kv_heads / world KV heads; when world exceeds
// num_kv_heads each KV head is replicated on the world / num_kv_heads ranks whose q heads read it.
// Every rank has its own page pools (its KV heads) with the same page ids: rank 0 runs the engine
// and the scheduler, and sends each step's batch (and any copy-on-write page copies) to the
// others, which run the same forward on their slice. The residual stream is summed across ranks
// after o_proj and down_proj (all-reduce) and after the embedding gather; the logits are gathered.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/model.h"
#include "pagedattn/model_file.h"
#include "pagedattn/tensor.h"

namespace pagedattn {

struct TpShard {
  int32_t rank = 0, world = 1;
};

// What one rank holds of a config's dimensions.
struct TpSlices {
  int32_t q_heads = 0, q_head0 = 0;    // local q heads and the first one's global index
  int32_t kv_heads = 0, kv_head0 = 0;  // local KV heads (1 when replicated) and the first
  int32_t inter = 0, inter0 = 0;       // intermediate rows of gate/up (columns of down)
  int32_t vocab = 0, vocab0 = 0;       // vocabulary rows of embed_tokens / lm_head
  int32_t vocab_stride = 0;            // ceil(vocab_size / world): every rank's logits width
};

// Error (naming the dimension) when config cannot be split `world` ways: q heads and the
// intermediate size must divide by world, and KV heads divide by world or world by KV heads.
TpSlices tp_slices(const ModelConfig& config, TpShard shard);

// Which part of the weight `name` (Hugging Face name, model_file.h) a rank holds: rows
// [row0, row0 + rows) and columns [col0, col0 + cols) of the whole [R, C] tensor (vectors are
// [1, C]).
struct TpBlock {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  int64_t whole_cols = 0;  // C
};
TpBlock tp_block(const std::string& name, const std::vector<int64_t>& shape,
                 const ModelConfig& config, TpShard shard);
// That block of a host f32 tensor, contiguous (for tests and file loading).
Tensor tp_weight_slice(const Tensor& whole, const std::string& name, const ModelConfig& config,
                       TpShard shard);

// How the group starts. Rank 0 serves; the other ranks follow it.
struct TensorParallelOptions {
  int32_t world_size = 1;
  int32_t rank = 0;
  // host:port where rank 0 listens for the others (their NCCL id and the steps come through it;
  // NCCL's own bootstrap then joins the GPUs, over TCP where they are on several hosts).
  // Empty on rank 0: 127.0.0.1 and a free port, with the workers spawned (worker_argv).
  std::string init_addr;
  int32_t cuda_device = -1;  // -1: rank % the visible devices
  // The command that starts a worker on this host; rank 0 appends --rank R --world-size N
  // --init-addr A. Empty: the other ranks are started by an external launcher.
  std::vector<std::string> worker_argv;
  double connect_timeout_s = 120;  // to gather every rank (model loading included)
};

// Rank 0: opens the group (spawning workers when worker_argv is set), loads its shard of `model`
// (a .gguf, a Hugging Face folder or synthetic:NAME) and returns the runner an Engine drives;
// every forward runs on all ranks. A rank that fails or dies ends the group: the next forward
// throws Error naming it, and Model::health says so. Error when CUDA or NCCL is missing.
std::unique_ptr<Model> create_tensor_parallel_model(const std::string& model,
                                                    const TensorParallelOptions& options);
// Ranks > 0: joins the group at options.init_addr and runs rank 0's steps until it shuts the
// group down (returns 0) or the group fails (returns 1, the reason on stderr).
int run_tensor_parallel_worker(const TensorParallelOptions& options);

}  // namespace pagedattn

namespace pagedattn {

class LlamaModelCuda;

// What create_tensor_parallel_model returns: rank 0's runner, which drives the whole group.
class TensorParallelModel : public Model {
 public:
  virtual int32_t world_size() const = 0;
  // Rank 0's own shard (its knobs, e.g. CUDA graphs, are sent to every rank with each step).
  virtual LlamaModelCuda& shard() = 0;
  // Seconds per step spent in collectives at a step of `tokens` tokens and `logit_rows` logit rows:
  // the median over `reps` timed runs of the step's collectives alone (2 * num_layers + 1
  // all-reduces of [tokens, hidden] f32 and the logits' all-gather), run on every rank.
  virtual double collective_seconds(int32_t tokens, int32_t logit_rows, int32_t reps) = 0;
};

}  // namespace pagedattn
