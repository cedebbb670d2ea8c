// One NCCL communicator of a tensor-parallel group: the collectives the sharded runner needs.
//
// NCCL is loaded on first use with dlopen (like cuBLAS, cublas_lazy.cpp), not linked: a binary
// that links it does not start where the library is absent, and only tensor-parallel runs need
// it. Builds whose CMake did not find nccl.h have no tensor parallelism (every call throws Error).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pagedattn::cuda {

// ncclUniqueId's bytes: made by rank 0, handed to every rank out of band (the group's TCP link).
using NcclId = std::array<char, 128>;

// Whether NCCL can be loaded here (built with it and the library found); `why` says why not.
bool nccl_available(std::string* why = nullptr);
// A fresh id (rank 0). Error when NCCL is unavailable.
NcclId nccl_unique_id();

class NcclComm {
 public:
  // Joins the group (blocks until every rank has joined); the current CUDA device is this rank's.
  NcclComm(const NcclId& id, int32_t world, int32_t rank);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int32_t rank() const { return rank_; }
  int32_t world() const { return world_; }

  // In place: buf [n] f32 = the sum over ranks, enqueued on stream (capturable in a CUDA graph).
  void all_reduce_sum(float* buf, size_t n, cudaStream_t stream);
  // recv [world, n] f32 = every rank's send [n], in rank order.
  void all_gather(const float* send, float* recv, size_t n, cudaStream_t stream);
  // Every rank's `bytes` [n] (host memory), in rank order [world * n]; blocks until done. For the
  // small exchanges of setting up (PeerAllReduce's memory handles), not for a step.
  std::vector<char> all_gather_host(const void* bytes, size_t n);
  // Ends every pending and future collective of this communicator with an error (another thread
  // may call it while one is blocked). Idempotent.
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  void* comm_ = nullptr;  // ncclComm_t
  int32_t world_ = 1, rank_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace pagedattn::cuda
