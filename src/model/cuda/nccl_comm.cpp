// NcclComm over a libnccl loaded with dlopen (nccl_comm.h says why it is not linked).
#include "nccl_comm.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "pagedattn/error.h"

#ifdef PAGEDATTN_HAVE_NCCL
#include <nccl.h>
#endif

namespace pagedattn::cuda {

#ifdef PAGEDATTN_HAVE_NCCL

namespace {

struct Nccl {
  void* handle = nullptr;
  std::string error;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
};

const Nccl& nccl() {
  static Nccl lib;
  static std::once_flag once;
  std::call_once(once, [] {
    // PAGEDATTN_NCCL_LIBRARY, then the soname through the loader's search, then the toolkit's
    // library folder this was built against.
    std::string candidates[3] = {"", "libnccl.so.2", ""};
    if (const char* env = std::getenv("PAGEDATTN_NCCL_LIBRARY")) candidates[0] = env;
#ifdef PAGEDATTN_NCCL_DIR
    candidates[2] = std::string(PAGEDATTN_NCCL_DIR) + "/libnccl.so.2";
#endif
    for (const std::string& name : candidates) {
      if (name.empty()) continue;
      lib.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib.handle) break;
      const char* e = dlerror();
      lib.error += (lib.error.empty() ? "" : "; ") + std::string(e ? e : name.c_str());
    }
    if (!lib.handle) {
      lib.error = "NCCL could not be loaded (" + lib.error +
                  "; set PAGEDATTN_NCCL_LIBRARY to the path of libnccl.so.2)";
      return;
    }
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib.handle, name));
      if (!f && lib.error.empty()) lib.error = std::string("NCCL has no symbol ") + name;
    };
    sym(lib.get_unique_id, "ncclGetUniqueId");
    sym(lib.init_rank, "ncclCommInitRank");
    sym(lib.abort, "ncclCommAbort");
    sym(lib.all_reduce, "ncclAllReduce");
    sym(lib.all_gather, "ncclAllGather");
    sym(lib.error_string, "ncclGetErrorString");
    sym(lib.async_error, "ncclCommGetAsyncError");
    if (!lib.error.empty()) lib.handle = nullptr;
  });
  return lib;
}

const Nccl& loaded() {
  const Nccl& n = nccl();
  PA_CHECK(n.handle != nullptr, "tensor parallel: ", n.error);
  return n;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("tensor parallel: ", what, ": ", nccl().error_string(r));
}

}  // namespace

bool nccl_available(std::string* why) {
  const Nccl& n = nccl();
  if (!n.handle && why) *why = n.error;
  return n.handle != nullptr;
}

NcclId nccl_unique_id() {
  ncclUniqueId id;
  check(loaded().get_unique_id(&id), "ncclGetUniqueId");
  NcclId out;
  static_assert(sizeof(id) == sizeof(out));
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

NcclComm::NcclComm(const NcclId& id, int32_t world, int32_t rank) : world_(world), rank_(rank) {
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof(nid));
  ncclComm_t c = nullptr;
  check(loaded().init_rank(&c, world, nid, rank), "ncclCommInitRank");
  comm_ = c;
}

NcclComm::~NcclComm() {
  // NOTE: abort, not ncclCommDestroy: destroying finalizes with the peers, and a peer that has
  // already gone (or aborted on seeing this rank's link close) leaves that waiting forever.
  // Every collective has completed by now (each step synchronises), so nothing is lost.
  abort();
}

void NcclComm::all_reduce_sum(float* buf, size_t n, cudaStream_t stream) {
  PA_CHECK(!aborted_, "tensor parallel: the group has been aborted");
  check(nccl().all_reduce(buf, buf, n, ncclFloat32, ncclSum, static_cast<ncclComm_t>(comm_),
                          stream),
        "all-reduce");
}

void NcclComm::all_gather(const float* send, float* recv, size_t n, cudaStream_t stream) {
  PA_CHECK(!aborted_, "tensor parallel: the group has been aborted");
  check(nccl().all_gather(send, recv, n, ncclFloat32, static_cast<ncclComm_t>(comm_), stream),
        "all-gather");
}

std::vector<char> NcclComm::all_gather_host(const void* bytes, size_t n) {
  PA_CHECK(!aborted_, "tensor parallel: the group has been aborted");
  std::vector<char> out(n * size_t(world_));
  if (n == 0) return out;
  void* dev = nullptr;
  cudaStream_t st = nullptr;
  auto done = [&] {
    if (dev) cudaFree(dev);
    if (st) cudaStreamDestroy(st);
  };
  try {
    PA_CHECK(cudaMalloc(&dev, out.size()) == cudaSuccess && cudaStreamCreate(&st) == cudaSuccess,
             "tensor parallel: cannot allocate the exchange buffer");
    char* d = static_cast<char*>(dev);
    PA_CHECK(cudaMemcpy(d + n * size_t(rank_), bytes, n, cudaMemcpyHostToDevice) == cudaSuccess,
             "tensor parallel: exchange upload failed");
    check(nccl().all_gather(d + n * size_t(rank_), d, n, ncclUint8,
                            static_cast<ncclComm_t>(comm_), st),
          "all-gather (setup)");
    PA_CHECK(cudaStreamSynchronize(st) == cudaSuccess &&
                 cudaMemcpy(out.data(), d, out.size(), cudaMemcpyDeviceToHost) == cudaSuccess,
             "tensor parallel: exchange download failed");
  } catch (...) {
    done();
    throw;
  }
  done();
  return out;
}

void NcclComm::abort() {
  if (!comm_ || aborted_.exchange(true)) return;
  (void)nccl().abort(static_cast<ncclComm_t>(comm_));
}

#else  // no nccl.h at build time

bool nccl_available(std::string* why) {
  if (why) *why = "pagedattn was built without NCCL (CMake found no nccl.h)";
  return false;
}
NcclId nccl_unique_id() { fail("tensor parallel: pagedattn was built without NCCL"); }
NcclComm::NcclComm(const NcclId&, int32_t, int32_t) {
  fail("tensor parallel: pagedattn was built without NCCL");
}
NcclComm::~NcclComm() = default;
void NcclComm::all_reduce_sum(float*, size_t, cudaStream_t) {}
void NcclComm::all_gather(const float*, float*, size_t, cudaStream_t) {}
std::vector<char> NcclComm::all_gather_host(const void*, size_t) { return {}; }
void NcclComm::abort() {}

#endif

}  // namespace pagedattn::cuda
