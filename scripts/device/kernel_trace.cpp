// A CUPTI injection library: every kernel the process runs (CUDA graph nodes included, kernels
// left concurrent) as one CSV line of start and duration in ns and the demangled name, written at
// exit to $KERNEL_TRACE_CSV (default kernel_trace.csv; a "%p" in it becomes the process id, for
// programs that start workers, such as tensor-parallel ranks). With KERNEL_TRACE_API=1 also the
// runtime API's calls ("api:NAME") and the copies ("copy:KIND:BYTES") on the same clock.
// NOTE: traced, a decode step's CUDA graph launch call took 0.26-0.49 ms on the host, and with it
// the gaps between steps and a rank's wait for a later rank: read those from untraced runs.
// Loaded by the CUDA driver through
//   CUDA_INJECTION64_PATH=libkernel_trace.so KERNEL_TRACE_CSV=t.csv <program>
// Built on the GPU machine by scripts/device/timeline-model.sh:
//   g++ -O2 -shared -fPIC kernel_trace.cpp -I<cuda>/include -L<cupti dir> -lcupti
#include <cupti.h>
#include <cupti_callbacks.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unistd.h>
#include <vector>

namespace {
struct Row { uint64_t start, end; std::string name; };
std::mutex g_mu;
std::vector<Row> g_rows;

void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buf = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      const char* n = nullptr;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &n) != CUPTI_SUCCESS) n = "?";
      g_rows.push_back({a->start, a->end, std::string("api:") + n});
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      g_rows.push_back({m->start, m->end, "copy:" + std::to_string(int(m->copyKind)) + ":" +
                                              std::to_string((unsigned long long)m->bytes)});
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    int status = 0;
    char* dem = abi::__cxa_demangle(k->name, nullptr, nullptr, &status);
    g_rows.push_back({k->start, k->end, status == 0 && dem ? dem : k->name});
    free(dem);
  }
  free(buf);
}

void write_at_exit() {
  cuptiActivityFlushAll(1);
  const char* env = getenv("KERNEL_TRACE_CSV");
  std::string path = env ? env : "kernel_trace.csv";
  if (const size_t at = path.find("%p"); at != std::string::npos)
    path.replace(at, 2, std::to_string(getpid()));
  FILE* f = fopen(path.c_str(), "w");
  if (!f) return;
  fprintf(f, "Start (ns),Duration (ns),Name\n");
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Row& r : g_rows) {
    std::string n = r.name;
    for (char& c : n)
      if (c == ',' || c == '"') c = ';';
    fprintf(f, "%llu,%llu,\"%s\"\n", (unsigned long long)r.start,
            (unsigned long long)(r.end - r.start), n.c_str());
  }
  fclose(f);
}
}  // namespace

extern "C" int InitializeInjection() {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    fprintf(stderr, "kernel_trace: CUPTI activity tracing could not start\n");
    return 0;
  }
  if (const char* api = getenv("KERNEL_TRACE_API"); api && atoi(api) == 1) {
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  }
  atexit(write_at_exit);
  return 1;
}
