// The frames rank 0 sends the other ranks of a tensor-parallel group (tp_link.h carries them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"
#include "tp_link.h"

namespace pagedattn::tp {

// Once, after every rank has joined: what to load and how to join NCCL.
struct InitMessage {
  std::string model;  // a .gguf, a Hugging Face folder or synthetic:NAME
  int32_t world = 1;
  std::vector<char> nccl_id;  // 128 bytes
};
std::vector<uint8_t> encode_init(const InitMessage& m);
InitMessage decode_init(const std::vector<uint8_t>& body);

// Per step: the cache every rank keeps (its page count and layout; KV heads are each rank's own),
// the copy-on-write copies made since the last step, and the batch. `time_reps` instead of a
// batch asks every rank to time the collectives (LlamaModelCuda::time_collectives); `calibrate`
// and `kv_headroom`, to calibrate and set fp8 KV scales.
struct StepMessage {
  int32_t num_layers = 0, head_dim = 0, page_size = 0, num_pages = 0;
  DType dtype = DType::bf16;
  bool cuda_graphs = true;
  bool greedy = false;  // every rank takes its slice's argmax (forward_device's `greedy`)
  // The step is a pass begun and left open (Model::begin_greedy / begin_sample: rank 0 schedules
  // ahead): its tokens may name the greedy ids of the pass open before it, which every rank has;
  // a worker finishes the older pass after it begins this one. Else the plain step of before.
  bool open = false;
  std::vector<PageCopy> copies;
  ForwardBatch batch;
  int32_t time_tokens = 0, time_rows = 0, time_reps = 0;  // > 0 reps: time the collectives
  // Instead of a step, the fp8 calibration: `calibrate` (non-empty) runs these tokens through
  // every rank's kv_absmax at once; then `kv_headroom` (> 0) tells the headroom rank 0 set its
  // scales with, and each rank sets its own heads' scales from its maxima the same way.
  std::vector<int32_t> calibrate;
  float kv_headroom = 0.f;
};
std::vector<uint8_t> encode_step(const StepMessage& m);
StepMessage decode_step(const std::vector<uint8_t>& body);

}  // namespace pagedattn::tp
