// PeerAllReduce: the one-kernel all-reduce over peer memory (peer_all_reduce.h has the picture).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "block_math.cuh"  // argmax_take, block_sum, load_row_groups, store_normed_row
#include "cuda_common.cuh"  // allow_dependent_launch, wait_for_dependency
#include "llama_kernels.h"  // ArgmaxPair
#include "nccl_comm.h"
#include "pdl.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#include "peer_all_reduce.h"

namespace pagedattn::cuda {

namespace {

constexpr const char* kOp = "tensor parallel: peer all-reduce";
constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 128;  // rows beyond the grid are looped over by the same blocks
constexpr int kThreads = 256, kVecs = 8;  // a row of up to kThreads * kVecs * 4 values in registers

// What peers write into a rank's memory: arrived[b][r] = the number of calls rank r's block b has
// started (its partial of that call is ready: it was written by the kernels before this one).
struct Flags {
  uint32_t arrived[kMaxBlocks][kMaxRanks];
  uint32_t gathered[kMaxRanks];  // the same for argmax_ids' calls
};

struct Peers {
  const float* input[kMaxRanks];  // every rank's partial [max_rows, hidden] (the call's slot)
  Flags* flags[kMaxRanks];        // every rank's flags
};

__device__ __forceinline__ void store_relaxed(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// grid (min(rows, kMaxBlocks)), block kThreads; block b owns rows b, b + grid, ...
// hidden % 4 == 0 and hidden <= kThreads * kVecs * 4 (checked on the host).
// The meeting's latency is hidden behind what needs no peer: the norm's weights are read before
// the wait for the kernel ahead (no kernel writes them), and this rank's partial and the residual
// row between the signal to the peers and the wait for theirs.
template <int W>
__global__ void __launch_bounds__(kThreads)
    peer_reduce_kernel(Peers peers, int rank, uint32_t* __restrict__ counters,
                       float* __restrict__ x,           // [rows, hidden] the residual stream
                       int add_x, const float* __restrict__ norm_w,  // [hidden] or null
                       float eps, uint16_t* __restrict__ h,          // [rows, hidden] bf16
                       int rows, int hidden) {
  const int nv = hidden / 4;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 w[kVecs];
  load_row_groups<kVecs, kThreads>(norm_w, nv, w);
  // The peers' pointers through shared memory, written with constant indices: an array of a
  // kernel's parameters indexed by a run-time value (a thread's rank, this rank) is copied to
  // every thread's stack first.
  // NOTE: measured on two H100s of one host (Llama-3-8B, batch 32, the same pair): with that
  // copy (16 stores in every thread, loads from them after) the step took 4.29-4.34 ms, without
  // it 3.96-3.98 (kernel_local_bytes: the tests keep it at 0).
  __shared__ const float* input[W];
  __shared__ Flags* flags[W];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int q = 0; q < W; ++q) input[q] = peers.input[q], flags[q] = peers.flags[q];
  }
  __syncthreads();
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  const uint32_t epoch = counters[blockIdx.x] + 1;
  const int t = threadIdx.x, b = blockIdx.x;
  // Block b of this rank tells block b of every peer that it has started call `epoch` (threads
  // 0..W-1 talk to rank t), and later waits until each of them has said the same.
  // NOTE: relaxed, no fence: what a peer reads after this was written by kernels that finished
  // before this one began (stream order), and is in this GPU's memory by then. A peer may already
  // be one call ahead (it passed this call and started the next): hence the wrapping >=, not ==.
  // One meeting per call is enough because the caller never uses a slot twice in a row: a rank
  // writes a slot again only after starting a call on another slot, which its peers reach only
  // after the kernel that read this slot has finished.
  if (t < W && t != rank) store_relaxed(&flags[t]->arrived[b][rank], epoch);
  bool met = false;
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = int64_t(r) * nv;
    float4 mine[kVecs], xs[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = threadIdx.x + k * kThreads;
      mine[k] =
          i < nv ? __ldcg(reinterpret_cast<const float4*>(input[rank]) + off + i) : zero;
      xs[k] = add_x && i < nv ? reinterpret_cast<const float4*>(x)[off + i] : zero;
    }
    if (!met) {  // the first row: now the peers' partials
      if (t < W && t != rank) {
        const uint32_t* mine_flag = &flags[rank]->arrived[b][t];
        while (int32_t(load_relaxed(mine_flag) - epoch) < 0) {
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) counters[blockIdx.x] = epoch;
      met = true;
    }
    // Every rank's rows in rank order: the same additions on every rank.
    float4 s[kVecs];
#pragma unroll
    for (int p = 0; p < W; ++p) {
      float4 v[kVecs];
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int i = threadIdx.x + k * kThreads;
        v[k] = p == rank ? mine[k]
               : i < nv  ? __ldcg(reinterpret_cast<const float4*>(input[p]) + off + i)
                         : zero;
      }
#pragma unroll
      for (int k = 0; k < kVecs; ++k) s[k] = p == 0 ? v[k] : add4(s[k], v[k]);
    }
    float4* xr = reinterpret_cast<float4*>(x) + off;
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i >= nv) continue;
      if (add_x) s[k] = add4(xs[k], s[k]);
      xr[i] = s[k];
      ss += s[k].x * s[k].x + s[k].y * s[k].y + s[k].z * s[k].z + s[k].w * s[k].w;
    }
    if (norm_w) {
      const float inv = rsqrtf(block_sum(ss) / float(hidden) + eps);
      store_normed_row<kVecs, kThreads>(reinterpret_cast<uint2*>(h) + off, s, w, inv, nv);
    }
  }
}

// grid 1, block kThreads: ids[r] = the fold of every rank's pairs[r] in rank order
// (argmax_combine's rules: rank 0's (NaN, 0) takes the row; else the largest value, its lowest
// id). One meeting a call, as in peer_reduce_kernel (its notes hold here): each rank's pairs were
// written by the kernels before this one.
template <int W>
__global__ void __launch_bounds__(kThreads)
    peer_argmax_kernel(Peers peers, int rank, uint32_t* __restrict__ counter,
                       int32_t* __restrict__ ids, int rows) {
  __shared__ const ArgmaxPair* pairs[W];
  __shared__ Flags* flags[W];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int q = 0; q < W; ++q)
      pairs[q] = reinterpret_cast<const ArgmaxPair*>(peers.input[q]), flags[q] = peers.flags[q];
  }
  __syncthreads();
  wait_for_dependency();
  allow_dependent_launch();
  const uint32_t epoch = *counter + 1;
  const int t = threadIdx.x;
  if (t < W && t != rank) store_relaxed(&flags[t]->gathered[rank], epoch);
  if (t < W && t != rank) {
    while (int32_t(load_relaxed(&flags[rank]->gathered[t]) - epoch) < 0) {
    }
  }
  __syncthreads();
  if (t == 0) *counter = epoch;
  for (int r = t; r < rows; r += kThreads) {
    uint2 raw[W];
#pragma unroll
    for (int q = 0; q < W; ++q) raw[q] = __ldcg(reinterpret_cast<const uint2*>(pairs[q]) + r);
    if (isnan(__uint_as_float(raw[0].x))) {  // rank 0's slice holds id 0
      ids[r] = 0;
      continue;
    }
    float best = -INFINITY;
    int32_t idx = INT32_MAX;
#pragma unroll
    for (int q = 0; q < W; ++q)
      argmax_take(__uint_as_float(raw[q].x), int32_t(raw[q].y), best, idx);
    ids[r] = idx;
  }
}

// The kernel for `world` ranks (null outside 2..kMaxRanks): one signature for every W.
using PeerKernel = decltype(&peer_reduce_kernel<2>);
PeerKernel peer_kernel(int32_t world) {
  static_assert(kMaxRanks == 8, "one entry a world size");
  constexpr PeerKernel kKernels[] = {peer_reduce_kernel<2>, peer_reduce_kernel<3>,
                                     peer_reduce_kernel<4>, peer_reduce_kernel<5>,
                                     peer_reduce_kernel<6>, peer_reduce_kernel<7>,
                                     peer_reduce_kernel<8>};
  return world >= 2 && world <= kMaxRanks ? kKernels[world - 2] : nullptr;
}

// What a rank tells the others about itself.
struct RankInfo {
  char host[64];
  char pci[32];
  int32_t pid;
  int32_t device;
  int32_t willing;  // PAGEDATTN_PEER_ALL_REDUCE is not 0 and the sizes agree
  int32_t max_rows, hidden;
  cudaIpcMemHandle_t handle;
  uint64_t pointer;
};

// A peer's exported buffer as this process sees it: the pointer itself for a thread of this
// process, else its CUDA IPC handle opened (and appended to `opened`). Null where that fails.
void* open_peer(bool same_process, uint64_t pointer, const cudaIpcMemHandle_t& handle,
                std::vector<void*>& opened) {
  if (same_process) return reinterpret_cast<void*>(uintptr_t(pointer));
  void* p = nullptr;
  if (cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  opened.push_back(p);
  return p;
}

// Every rank's outcome of its mapping, shared: where this rank has no `reason` of its own, the
// first rank that failed gives it (so that every rank answers the same).
void agree_on_mapping(NcclComm& comm, std::string& reason, const char* what) {
  const char ok = reason.empty() ? 1 : 0;
  const std::vector<char> oks = comm.all_gather_host(&ok, 1);
  for (int32_t r = 0; r < comm.world() && reason.empty(); ++r) {
    if (!oks[size_t(r)]) reason = "rank " + std::to_string(r) + " cannot map its peers' " + what;
  }
}

size_t slot_bytes(int32_t max_rows, int32_t hidden) {
  const size_t data = size_t(max_rows) * size_t(hidden) * 4;
  return (data + 255) / 256 * 256;
}
size_t flags_offset(int32_t max_rows, int32_t hidden) {
  return PeerAllReduce::kSlots * slot_bytes(max_rows, hidden);
}
// argmax_ids' pairs [max_rows] after the flags.
size_t pairs_offset(int32_t max_rows, int32_t hidden) {
  return (flags_offset(max_rows, hidden) + sizeof(Flags) + 255) / 256 * 256;
}
size_t allocation_bytes(int32_t max_rows, int32_t hidden) {
  return pairs_offset(max_rows, hidden) + size_t(max_rows) * sizeof(ArgmaxPair);
}

using ArgmaxKernel = decltype(&peer_argmax_kernel<2>);
ArgmaxKernel argmax_kernel(int32_t world) {
  constexpr ArgmaxKernel kKernels[] = {peer_argmax_kernel<2>, peer_argmax_kernel<3>,
                                       peer_argmax_kernel<4>, peer_argmax_kernel<5>,
                                       peer_argmax_kernel<6>, peer_argmax_kernel<7>,
                                       peer_argmax_kernel<8>};
  return world >= 2 && world <= kMaxRanks ? kKernels[world - 2] : nullptr;
}

}  // namespace

std::unique_ptr<PeerAllReduce> PeerAllReduce::create(NcclComm& comm, int32_t max_rows,
                                                     int32_t hidden, std::string* why) {
  const int32_t world = comm.world(), rank = comm.rank();
  auto say = [&](const std::string& w) {
    if (why) *why = w;
  };
  std::unique_ptr<PeerAllReduce> pr(new PeerAllReduce());
  pr->world_ = world;
  pr->rank_ = rank;
  pr->max_rows_ = max_rows;
  pr->hidden_ = hidden;
  const bool shape_ok = world >= 2 && world <= kMaxRanks && max_rows > 0 && hidden > 0 &&
                        hidden % 4 == 0 && hidden <= kThreads * kVecs * 4;
  const char* env = std::getenv("PAGEDATTN_PEER_ALL_REDUCE");
  const bool wanted = !(env && std::string(env) == "0");

  RankInfo me{};
  gethostname(me.host, sizeof(me.host) - 1);
  me.pid = int32_t(getpid());
  PA_CHECK(cudaGetDevice(&me.device) == cudaSuccess, kOp, ": no current device");
  PA_CHECK(cudaDeviceGetPCIBusId(me.pci, sizeof(me.pci) - 1, me.device) == cudaSuccess, kOp,
           ": cannot read the device's PCI bus id");
  me.max_rows = max_rows;
  me.hidden = hidden;
  me.willing = shape_ok && wanted;
  if (me.willing) {
    const size_t bytes = allocation_bytes(max_rows, hidden);
    constexpr size_t kCounterBytes = (kMaxBlocks + 1) * 4;
    bool ok = cudaMalloc(&pr->own_, bytes) == cudaSuccess &&
              cudaMemset(pr->own_, 0, bytes) == cudaSuccess &&
              cudaMalloc(reinterpret_cast<void**>(&pr->counters_), kCounterBytes) == cudaSuccess &&
              cudaMemset(pr->counters_, 0, kCounterBytes) == cudaSuccess &&
              cudaIpcGetMemHandle(&me.handle, pr->own_) == cudaSuccess &&
              cudaDeviceSynchronize() == cudaSuccess;  // zeroed before any peer can signal
    if (!ok) {
      (void)cudaGetLastError();
      me.willing = 0;
    }
    me.pointer = uint64_t(reinterpret_cast<uintptr_t>(pr->own_));
  }
  const std::vector<char> gathered = comm.all_gather_host(&me, sizeof(me));
  std::vector<RankInfo> infos(static_cast<size_t>(world));
  std::memcpy(infos.data(), gathered.data(), infos.size() * sizeof(RankInfo));

  // Map every peer's allocation; any failure here is this rank's "no", shared below.
  std::string reason;
  if (!shape_ok) {
    reason = "world " + std::to_string(world) + " or hidden size " + std::to_string(hidden) +
             " outside what the kernel takes";
  } else if (!wanted) {
    reason = "PAGEDATTN_PEER_ALL_REDUCE=0";
  }
  pr->bases_.assign(size_t(world), nullptr);
  for (int32_t r = 0; r < world && reason.empty(); ++r) {
    const RankInfo& o = infos[size_t(r)];
    if (!o.willing) {
      reason = "rank " + std::to_string(r) + " declined";
      break;
    }
    if (o.max_rows != max_rows || o.hidden != hidden) {
      reason = "the ranks' sizes differ";
      break;
    }
    if (r == rank) {
      pr->bases_[size_t(r)] = pr->own_;
      continue;
    }
    if (std::strncmp(o.host, me.host, sizeof(me.host)) != 0) {
      reason = "rank " + std::to_string(r) + " runs on another host";
      break;
    }
    int dev = -1, can = 0;
    if (cudaDeviceGetByPCIBusId(&dev, o.pci) != cudaSuccess ||
        cudaDeviceCanAccessPeer(&can, me.device, dev) != cudaSuccess || !can) {
      (void)cudaGetLastError();
      reason = "this GPU cannot reach rank " + std::to_string(r) + "'s memory";
      break;
    }
    const bool same_process = o.pid == me.pid;  // ranks as threads: plain peer pointers
    if (same_process) {
      const cudaError_t e = cudaDeviceEnablePeerAccess(dev, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        reason = "cannot enable peer access to rank " + std::to_string(r);
        break;
      }
      (void)cudaGetLastError();
    }
    pr->bases_[size_t(r)] = open_peer(same_process, o.pointer, o.handle, pr->ipc_opened_);
    if (!pr->bases_[size_t(r)])
      reason = "cannot map rank " + std::to_string(r) + "'s memory (CUDA IPC)";
  }
  agree_on_mapping(comm, reason, "memory");
  if (!reason.empty()) {
    say(reason);
    return nullptr;  // the destructor unmaps and frees what was made
  }
  return pr;
}

std::vector<const void*> PeerAllReduce::map_peer_buffers(NcclComm& comm, const void* own,
                                                         bool willing, std::string* why) {
  struct Info {  // what a rank tells the others about its buffer
    int32_t pid;
    int32_t willing;
    cudaIpcMemHandle_t handle;
    uint64_t pointer;
  };
  Info me{};
  me.pid = int32_t(getpid());
  me.pointer = uint64_t(reinterpret_cast<uintptr_t>(own));
  me.willing = willing && own &&
               cudaIpcGetMemHandle(&me.handle, const_cast<void*>(own)) == cudaSuccess;
  if (!me.willing) (void)cudaGetLastError();
  const std::vector<char> gathered = comm.all_gather_host(&me, sizeof(me));
  std::vector<Info> infos(static_cast<size_t>(world_));
  std::memcpy(infos.data(), gathered.data(), infos.size() * sizeof(Info));
  std::string reason;
  std::vector<const void*> out(size_t(world_), nullptr);
  std::vector<void*> opened;
  for (int32_t r = 0; r < world_ && reason.empty(); ++r) {
    const Info& o = infos[size_t(r)];
    if (!o.willing) {
      reason = "rank " + std::to_string(r) + " did not export its buffer";
    } else {  // (this rank's or a thread's of this process: the pointer itself)
      out[size_t(r)] = open_peer(r == rank_ || o.pid == me.pid, o.pointer, o.handle, opened);
      if (!out[size_t(r)])
        reason = "cannot map rank " + std::to_string(r) + "'s buffer (CUDA IPC)";
    }
  }
  agree_on_mapping(comm, reason, "buffers");
  if (!reason.empty()) {
    for (void* p : opened) cudaIpcCloseMemHandle(p);
    if (why) *why = reason;
    return {};
  }
  ipc_opened_.insert(ipc_opened_.end(), opened.begin(), opened.end());
  return out;
}

// NOTE: no meeting here: a peer whose last step had no logit rows (no all-gather to wait on) may
// still be reading this rank's slot when this rank shuts down; that peer is shutting down too,
// and at worst reports a failed read as it leaves.
PeerAllReduce::~PeerAllReduce() {
  for (void* p : ipc_opened_) cudaIpcCloseMemHandle(p);
  if (own_) cudaFree(own_);
  if (counters_) cudaFree(counters_);
}

float* PeerAllReduce::input(int32_t slot) const {
  PA_CHECK(slot >= 0 && slot < kSlots, kOp, ": slot ", slot, " of ", kSlots);
  return reinterpret_cast<float*>(static_cast<char*>(own_) +
                                  size_t(slot) * slot_bytes(max_rows_, hidden_));
}

int64_t PeerAllReduce::kernel_local_bytes(int32_t world) {
  cudaFuncAttributes fa{};
  const PeerKernel kernel = peer_kernel(world);
  if (!kernel || cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return int64_t(fa.localSizeBytes);
}

void PeerAllReduce::reduce(int32_t slot, float* x, bool add_x, int32_t rows, const float* norm_w,
                           float eps, uint16_t* h, cudaStream_t stream) {
  PA_CHECK(slot >= 0 && slot < kSlots, kOp, ": slot ", slot, " of ", kSlots);
  PA_CHECK(slot != last_slot_, kOp, ": slot ", slot, " used twice in a row (a peer may still be ",
           "reading it)");
  PA_CHECK(rows >= 0 && rows <= max_rows_, kOp, ": ", rows, " rows, at most ", max_rows_);
  PA_CHECK(!norm_w || h, kOp, ": a norm needs its output");
  if (rows == 0) return;
  last_slot_ = slot;
  Peers peers{};
  const size_t fo = flags_offset(max_rows_, hidden_);
  for (int32_t r = 0; r < world_; ++r) {
    char* base = static_cast<char*>(bases_[size_t(r)]);
    peers.input[r] =
        reinterpret_cast<const float*>(base + size_t(slot) * slot_bytes(max_rows_, hidden_));
    peers.flags[r] = reinterpret_cast<Flags*>(base + fo);
  }
  const unsigned grid = unsigned(std::min(rows, kMaxBlocks));
  const PeerKernel kernel = peer_kernel(world_);
  PA_CHECK(kernel, kOp, ": world ", world_);
  const cudaError_t e = launch_pdl(kernel, dim3(grid), dim3(kThreads), 0, stream, peers, rank_,
                                   counters_, x, int(add_x), norm_w, eps, h, rows, hidden_);
  PA_CHECK(e == cudaSuccess, kOp, ": launch failed: ", cudaGetErrorString(e));
}

ArgmaxPair* PeerAllReduce::pairs() const {
  return reinterpret_cast<ArgmaxPair*>(static_cast<char*>(own_) +
                                       pairs_offset(max_rows_, hidden_));
}

void PeerAllReduce::argmax_ids(int32_t rows, int32_t* ids, cudaStream_t stream) {
  PA_CHECK(rows >= 0 && rows <= max_rows_, kOp, ": argmax of ", rows, " rows, at most ",
           max_rows_);
  PA_CHECK(rows == 0 || ids, kOp, ": argmax without ids");
  if (rows == 0) return;
  Peers peers{};
  for (int32_t r = 0; r < world_; ++r) {
    char* base = static_cast<char*>(bases_[size_t(r)]);
    peers.input[r] = reinterpret_cast<const float*>(base + pairs_offset(max_rows_, hidden_));
    peers.flags[r] = reinterpret_cast<Flags*>(base + flags_offset(max_rows_, hidden_));
  }
  const ArgmaxKernel kernel = argmax_kernel(world_);
  PA_CHECK(kernel, kOp, ": world ", world_);
  const cudaError_t e = launch_pdl(kernel, dim3(1), dim3(kThreads), 0, stream, peers, rank_,
                                   counters_ + kMaxBlocks, ids, rows);
  PA_CHECK(e == cudaSuccess, kOp, ": argmax launch failed: ", cudaGetErrorString(e));
}

}  // namespace pagedattn::cuda
