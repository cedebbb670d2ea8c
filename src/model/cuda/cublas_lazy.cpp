// cuBLAS loaded on first use, not at program start.
//
// The CUDA runner calls six cuBLAS functions. Linking libcublas makes every process load it and
// libcublasLt (over 600 MB of mappings whose static data, about 150 MB, becomes resident at
// start-up) even when it only ever runs on the CPU: a CPU `generate` of the default model was
// 290 MB resident, half of it cuBLAS. So the library does not link cuBLAS; this file defines
// those six entry points itself, and each one loads libcublas with dlopen the first time it is
// called and forwards to the real function (dlsym on the library's own handle, so there is no
// recursion into these definitions).
//
// NOTE: the names are cuBLAS's exported C symbols (cublas_v2.h maps cublasCreate to
// cublasCreate_v2 and so on): llama_cuda.cpp includes <cublas_v2.h> and calls them as usual.
// A program that links libcublas itself (the kernel lab) resolves them to whichever comes first;
// both are the same function.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#ifndef PAGEDATTN_CUBLAS_SONAME
#error "PAGEDATTN_CUBLAS_SONAME (e.g. libcublas.so.13) is set by src/model/CMakeLists.txt"
#endif

namespace {

struct Cublas {
  void *handle = nullptr;
  std::string error;  // why loading failed, for cublasGetStatusString
};

const Cublas &cublas_library() {
  static Cublas lib;
  static std::once_flag once;
  std::call_once(once, [] {
    // The soname through the loader's search (LD_LIBRARY_PATH, ld.so.cache, RUNPATH), then the
    // toolkit's library folder this was built against.
    const char *candidates[] = {PAGEDATTN_CUBLAS_SONAME,
#ifdef PAGEDATTN_CUBLAS_DIR
                                PAGEDATTN_CUBLAS_DIR "/" PAGEDATTN_CUBLAS_SONAME
#endif
    };
    for (const char *name : candidates) {
      lib.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib.handle) return;
      const char *e = dlerror();
      lib.error += std::string(lib.error.empty() ? "" : "; ") + (e ? e : name);
    }
    lib.error = "cuBLAS could not be loaded (" + lib.error + ")";
  });
  return lib;
}

// The real function `name` of type F, or nullptr when the library or the symbol is missing.
template <typename F>
F real(const char *name) {
  const Cublas &lib = cublas_library();
  return lib.handle ? reinterpret_cast<F>(dlsym(lib.handle, name)) : nullptr;
}

}  // namespace

#define PAGEDATTN_FORWARD(name, params, args)                                   \
  extern "C" cublasStatus_t CUBLASWINAPI name params {                          \
    using F = cublasStatus_t(CUBLASWINAPI *) params;                            \
    static const F f = real<F>(#name);                                          \
    return f ? f args : CUBLAS_STATUS_NOT_INITIALIZED;                          \
  }

PAGEDATTN_FORWARD(cublasCreate_v2, (cublasHandle_t * handle), (handle))
PAGEDATTN_FORWARD(cublasDestroy_v2, (cublasHandle_t handle), (handle))
PAGEDATTN_FORWARD(cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream),
                  (handle, stream))
PAGEDATTN_FORWARD(cublasSetWorkspace_v2,
                  (cublasHandle_t handle, void *workspace, size_t workspace_bytes),
                  (handle, workspace, workspace_bytes))
PAGEDATTN_FORWARD(cublasGemmEx,
                  (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                   int m, int n, int k, const void *alpha, const void *a, cudaDataType a_type,
                   int lda, const void *b, cudaDataType b_type, int ldb, const void *beta, void *c,
                   cudaDataType c_type, int ldc, cublasComputeType_t compute_type,
                   cublasGemmAlgo_t algo),
                  (handle, transa, transb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c,
                   c_type, ldc, compute_type, algo))

#undef PAGEDATTN_FORWARD

extern "C" const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  using F = const char *(CUBLASWINAPI *)(cublasStatus_t);
  static const F f = real<F>("cublasGetStatusString");
  if (f) return f(status);
  const std::string &why = cublas_library().error;
  return why.empty() ? "cuBLAS lacks cublasGetStatusString" : why.c_str();
}
