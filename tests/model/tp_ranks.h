// Two tensor-parallel ranks as threads of one test process, rank r on GPU r (NCCL allows it).
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <thread>

#include "model/cuda/nccl_comm.h"

namespace pagedattn::testing {

// Runs f(rank) on two threads at once and fails the test with any rank's error. A rank that
// throws aborts both communicators: the other may be waiting in a collective for it.
template <class F>
void on_two_ranks(std::unique_ptr<cuda::NcclComm> (&comm)[2], F&& f) {
  std::thread t[2];
  std::string err[2];
  for (int r = 0; r < 2; ++r) {
    t[r] = std::thread([&, r] {
      try {
        cudaSetDevice(r);
        f(r);
      } catch (const std::exception& e) {
        err[r] = e.what();
        for (auto& c : comm)
          if (c) c->abort();
      }
    });
  }
  for (auto& th : t) th.join();
  for (int r = 0; r < 2; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
}

}  // namespace pagedattn::testing
