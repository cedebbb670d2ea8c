// The model runner interface the engine drives: one forward pass over a ragged batch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "pagedattn/model_file.h"
#include "pagedattn/tensor.h"

namespace pagedattn {

// One step's batch, built by the scheduler. Sequence b's new tokens are rows
// q_indptr[b] .. q_indptr[b+1] of tokens/positions/slots; the cache already holds their slots
// (KvCache::append_slots) and kv_len(seqs[b]) counts them.
struct ForwardBatch {
  std::vector<SeqId> seqs;             // [num_seqs]
  std::vector<int32_t> q_indptr;       // [num_seqs + 1]
  std::vector<int32_t> tokens;         // [num_tokens]
  std::vector<int32_t> positions;      // [num_tokens]
  std::vector<int32_t> slots;          // [num_tokens]
  std::vector<int32_t> logit_rows;     // token rows whose logits are wanted (usually each seq's last)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Device device() const = 0;
  // Runs every layer over the batch, writing the new tokens' K/V into the cache.
  // Returns logits [logit_rows.size(), vocab_size] as f32 on the CPU.
  virtual Tensor forward(const ForwardBatch& batch, KvCache& cache) = 0;
};

// The runner for a loaded model file on `device`: the Llama family (llama, mistral, qwen2, qwen3).
// Throws Error for an architecture or device that has no forward path.
std::unique_ptr<Model> create_model(const ModelFile& file, Device device);

}  // namespace pagedattn
