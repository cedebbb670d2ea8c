// What an Engine is built with: its KV budget and dtype, the scheduler's limits and policies, and
// the tokenizer's decode function.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>


namespace pagedattn {

// Token ids -> bytes, concatenative (byte-level BPE: decode(a + b) == decode(a)
// + decode(b)), special tokens skipped. Without one, outputs carry token ids
// only and stop strings are refused.
using DecodeFn = std::function<std::string(const std::vector<int32_t>&)>;

// Admission (the scheduler's): lookahead admits only while the forecast peak of the running
// batch's pages fits; immediate as soon as a request's first chunk fits (grows into preemptions
// when lengths do).
enum class AdmissionPolicy : uint8_t { lookahead, immediate };
// Preemption victims: the sequence with the fewest computed tokens (the newest among equals), or
// the newest.
enum class VictimPolicy : uint8_t { least_work, newest };
// "lookahead" | "immediate"; throws Error naming the option otherwise.
AdmissionPolicy parse_admission_policy(const std::string& name);
// What a preemption does with the victim's computed tokens: cheaper (chosen per sequence: swap its
// pages to host memory and back when the copies cost less than computing the tokens again, from
// the rates measured so far), recompute (free the pages; the prefix cache keeps what it can), or
// swap (whenever the swap space holds it).
enum class PreemptionMode : uint8_t { cheaper, recompute, swap };
// "auto" (cheaper) | "recompute" | "swap"; throws Error naming the option otherwise.
PreemptionMode parse_preemption_mode(const std::string& name);

struct EngineConfig {
  // KV budget, first that is set: tokens, MiB, a fraction of free memory (the device's after the
  // weights are loaded; on the CPU, MemAvailable); else what the longest context takes for every
  // sequence at once (max_model_len x max_num_seqs tokens), at most kDefaultKvMiB.
  int64_t kv_cache_tokens = 0;
  double kv_cache_memory_mib = 0;
  double kv_cache_memory_fraction = 0;  // (0, 1]; 0: off
  int32_t page_size = 16;
  std::string kv_cache_dtype = "auto";  // auto (f32 on the CPU) | f32 | f16 | bf16 | fp8
  // fp8: the tokens of the calibration pass that sets the per-head scales (kv_calibration_text()).
  std::vector<int32_t> kv_calibration_tokens;
  // Ids that end generation besides the model's eos (the tokenizer's end-of-turn tokens).
  std::vector<int32_t> eos_token_ids;
  bool enable_prefix_cache = true;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 64;
  int32_t watermark_pages = -1;  // -1: 1% of the pool
  // The scheduler's admission and preemption victims.
  AdmissionPolicy admission = AdmissionPolicy::lookahead;
  VictimPolicy victim = VictimPolicy::least_work;
  PreemptionMode preemption = PreemptionMode::cheaper;
  // Host memory for the pages of swapped-out sequences, MiB (page-locked with a CUDA cache); -1:
  // kDefaultSwapMiB when the cache is on a CUDA device, none on the CPU (there the pool already is
  // host memory: a preempted sequence keeps what the prefix cache holds). 0: never swap.
  double swap_space_mib = -1;
  // Pin the swap space's host memory as the engine starts (1.4-3.2 s for 4 GiB on an H100
  // machine) instead of at the first swaps, where it costs more than the copies (a server:
  // `pagedattn serve` sets it).
  bool reserve_swap_space = false;
  int32_t max_model_len = 0;  // 0: the model's max_position_embeddings
  bool log_startup = true;    // print the cache's capacity to stderr
  // CPU: f32 activations against the dequantised weights (Model::set_exact_matmul) instead of
  // int8 activation blocks.
  bool exact_matmul = false;
  // Steps take their ids from Model::forward_greedy (plain greedy) or Model::forward_sample (any
  // other sampling), picked where the logits are; false: every step downloads its logits and
  // picks on the host (sample_plan.h's host twin).
  bool device_sampling = true;
  // SchedulerConfig::prefill_first: running decodes wait while a prefill can be scheduled.
  bool prefill_first = false;
  // Schedule ahead: while a greedy decode step runs, the engine schedules and begins the next one,
  // its tokens taken from the running step's ids on the device (Model::begin_greedy), and then
  // reads and handles the running step's ids while the next one runs. Only when nothing waits and
  // every running sequence is a plain greedy row of the step; a row whose sequence stops at the
  // step (EOS, a stop string, a cancel) is computed and dropped. -1: where the runner overlaps its
  // passes (Model::overlaps_passes: CUDA); 0: never; 1: always (the same tokens either way).
  int32_t schedule_ahead = -1;

  static constexpr double kDefaultKvMiB = 512;
  static constexpr double kDefaultSwapMiB = 4096;
};

}  // namespace pagedattn
