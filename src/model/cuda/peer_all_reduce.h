// The all-reduce of a tensor-parallel decode step over the GPUs' peer memory (NVLink or PCIe peer
// access), fused with the residual add and the next RMSNorm.
//
// A decode step sums [batch, hidden] f32 partial products over the ranks twice a layer. Through
// NCCL each of those is ~15 us, bound by its protocol's latency, not by the 0.5 MB it moves; here
// every rank maps every other rank's buffers (CUDA IPC between processes, peer pointers between
// threads of one process) and one kernel does the whole exchange: each block signals its peers
// that its rank's partial is ready, waits for theirs, reads every rank's rows straight from the
// peers' memory, sums them in rank order (so every rank holds the same bits), adds the residual
// stream and writes the next layer's normalised input. The partials go to one of kSlots buffers,
// never the same one twice in a row, so a rank never overwrites rows a peer may still be reading
// (the kernel's one signal also tells that the peer's previous call has finished). Only ranks on
// one host whose GPUs reach each other's memory use it; otherwise (several hosts, no peer access,
// PAGEDATTN_PEER_ALL_REDUCE=0, rows beyond max_rows) the runner keeps NCCL. The same mapping
// carries a greedy step's argmax pairs (argmax_ids: one kernel instead of NCCL's all-gather and
// the fold after it).
//
// NOTE: every rank must make the same calls in the same order with the same row counts (the
// tensor-parallel step guarantees it: every rank runs the same launches), as with NCCL: a block
// waits for the same block of every peer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pagedattn::cuda {

class NcclComm;
struct ArgmaxPair;  // llama_kernels.h

class PeerAllReduce {
 public:
  // Collective: every rank of `comm` calls it at the same point. Null (and `why` says why) when
  // some rank cannot map every other rank's memory; every rank then gets null.
  static std::unique_ptr<PeerAllReduce> create(NcclComm& comm, int32_t max_rows, int32_t hidden,
                                               std::string* why = nullptr);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  static constexpr int32_t kSlots = 3;
  // This rank's partial product [max_rows, hidden] f32 in `slot`: what reduce(slot) sums over the
  // ranks.
  float* input(int32_t slot) const;
  int32_t max_rows() const { return max_rows_; }
  int32_t hidden() const { return hidden_; }

  // x [rows, hidden] f32 = (add_x ? x : 0) + sum over ranks r (in rank order) of
  // input_r(slot)[rows]; then, when norm_w is given, h [rows, hidden] bf16 =
  // x * rsqrt(mean(x^2) + eps) * norm_w. Enqueued on stream; capturable in a CUDA graph.
  // rows <= max_rows; slot differs from the previous call's (Error otherwise, nothing enqueued).
  void reduce(int32_t slot, float* x, bool add_x, int32_t rows, const float* norm_w, float eps,
              uint16_t* h, cudaStream_t stream);

  // A greedy step's ids without an all-gather: every rank writes its slice's pair of each row
  // (llama_kernels.h's argmax_rows_slice answer) to pairs() [max_rows], then argmax_ids folds
  // every rank's, in rank order, into ids [rows] (argmax_combine's answer over the gathered
  // pairs, bit for bit). Collective and in stream order, as reduce(); a rank writes pairs() again
  // only after a later reduce() or NCCL collective with its peers (a decode step's layers make
  // them), so no peer is still reading the last ones.
  ArgmaxPair* pairs() const;
  void argmax_ids(int32_t rows, int32_t* ids, cudaStream_t stream);

  // Every rank's buffer `own` (this rank's: the start of an allocation of its own, read-only
  // while mapped) as this rank sees it, in rank order: CUDA IPC between processes, the pointers
  // themselves between threads. Collective, as create() is; every rank gets an empty vector (and
  // `why` says why) when any rank is not `willing` or cannot export or map its buffer. The
  // mappings last as long as this object.
  std::vector<const void*> map_peer_buffers(NcclComm& comm, const void* own, bool willing,
                                            std::string* why = nullptr);

  // The local memory (stack) a thread of the kernel for `world` ranks uses on this device: 0 is
  // what the kernel is written for (its tests check it; a copy of its arguments to the stack made
  // a batch-32 step of two H100s 9% longer). -1: the runtime could not say.
  static int64_t kernel_local_bytes(int32_t world);

 private:
  PeerAllReduce() = default;
  int32_t world_ = 1, rank_ = 0, max_rows_ = 0, hidden_ = 0;
  int32_t last_slot_ = -1;
  void* own_ = nullptr;  // this rank's mapped allocation: the slots, the flags, then pairs()
  std::vector<void*> bases_;        // every rank's allocation as this rank sees it
  std::vector<void*> ipc_opened_;   // the ones opened through CUDA IPC (closed at the end)
  uint32_t* counters_ = nullptr;  // [kMaxBlocks + 1] this rank's count of calls, per block;
                                  // the last: of argmax_ids calls
};

}  // namespace pagedattn::cuda
