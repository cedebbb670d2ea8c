// pagedattn.KvCache: the paged KV cache of a model (kv_cache.h) from Python. Its pools are
// handed out as numpy arrays or torch tensors over the cache's own memory (no copy): the array
// keeps the cache alive.
//
//   k_pool(layer), v_pool(layer): [num_pages, num_kv_heads, page_size, head_dim]
//   (fp8 e4m3 pools as uint8 bytes; torch: .view(torch.float8_e4m3fn))
//   k_scale(layer), v_scale(layer): [num_kv_heads] float32 on the pools' device (fp8 only)
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "arrays.h"
#include "cuda_device.h"
#include "pagedattn/error.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::python {

namespace {

// A 1-D int32 numpy array owning a copy of v.
nb::object int32_array(std::vector<int32_t> v) {
  auto* owned = new std::vector<int32_t>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  return nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>(owned->data(), {owned->size()}, owner).cast();
}

// Builds an array of the framework over memory that `owner` keeps alive.
nb::object wrap(void* data, std::initializer_list<size_t> shape, DType dtype, const Place& where,
                nb::handle owner, const std::string& framework) {
  const int dev = where.device == Device::cuda ? nb::device::cuda::value : nb::device::cpu::value;
  const nb::dlpack::dtype t = dlpack_dtype(dtype);
  if (framework == "numpy") {
    PA_CHECK(where.device == Device::cpu,
             "KvCache: numpy arrays live in host memory but the cache is on ", place_name(where),
             " (use framework='torch' or 'dlpack')");
    PA_CHECK(dtype != DType::bf16,
             "KvCache: numpy has no bfloat16 (use framework='torch' or 'dlpack')");
    return nb::ndarray<nb::numpy>(data, shape, owner, {}, t, dev, where.device_id).cast();
  }
  if (framework == "torch") {
    return nb::ndarray<nb::pytorch>(data, shape, owner, {}, t, dev, where.device_id).cast();
  }
  PA_CHECK(framework == "dlpack", "KvCache: framework must be 'numpy', 'torch' or 'dlpack', got '",
           framework, "'");
  return nb::ndarray<nb::array_api>(data, shape, owner, {}, t, dev, where.device_id).cast();
}

class PyKvCache {
 public:
  PyKvCache(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim, int32_t page_size,
            int32_t num_pages, const std::string& dtype, const std::string& device,
            int32_t device_id, bool enable_prefix_cache) {
    KvCacheConfig c;
    c.num_layers = num_layers;
    c.num_kv_heads = num_kv_heads;
    c.head_dim = head_dim;
    c.page_size = page_size;
    c.num_pages = num_pages;
    c.dtype = parse_dtype(dtype);
    PA_CHECK(device == "cpu" || device == "cuda", "KvCache: device must be 'cpu' or 'cuda', got '",
             device, "'");
    c.device = device == "cuda" ? Device::cuda : Device::cpu;
    c.enable_prefix_cache = enable_prefix_cache;
    place_ = {c.device, c.device == Device::cuda ? device_id : 0};
    CudaDeviceGuard guard(place_.device_id);
    if (c.device == Device::cuda) {
      PA_CHECK(device_id >= 0 && device_id < cuda_device_count(),
               "KvCache: device cuda:", device_id, " is not available (", cuda_device_count(),
               " CUDA devices)");
    }
    cache_ = std::make_unique<KvCache>(c);
  }

  KvCache& cache() { return *cache_; }
  const Place& place() const { return place_; }

  nb::object pool(int32_t layer, bool v, const std::string& framework) {
    const PagedKVView kv = cache_->layer_view(layer);
    return wrap(
        v ? kv.v_pages : kv.k_pages,
        {size_t(kv.num_pages), size_t(kv.num_kv_heads), size_t(kv.page_size), size_t(kv.head_dim)},
        kv.dtype, place_, nb::find(this), framework);
  }

  nb::object scale(int32_t layer, bool v, const std::string& framework) {
    const PagedKVView kv = cache_->layer_view(layer);
    PA_CHECK(kv.dtype == DType::fp8_e4m3, "KvCache: the cache is ", dtype_name(kv.dtype),
             "; scales exist for fp8_e4m3 caches only");
    PA_CHECK(cache_->scales_set(), "KvCache: the scales are not set yet (set_scales)");
    return wrap(const_cast<float*>(v ? kv.v_scale : kv.k_scale), {size_t(kv.num_kv_heads)},
                DType::f32, place_, nb::find(this), framework);
  }

  uintptr_t pool_ptr(int32_t layer, bool v) const {
    const PagedKVView kv = cache_->layer_view(layer);
    return reinterpret_cast<uintptr_t>(v ? kv.v_pages : kv.k_pages);
  }

  nb::dict stats() const {
    const KvCacheStats s = cache_->stats();
    nb::dict d;
    d["num_pages"] = s.num_pages;
    d["pages_used"] = s.pages_used;
    d["pages_free"] = s.pages_free;
    d["pages_cached"] = s.pages_cached;
    d["tail_slots_wasted"] = s.tail_slots_wasted;
    d["prefix_queries"] = s.prefix_queries;
    d["prefix_hits"] = s.prefix_hits;
    d["evictions"] = s.evictions;
    d["num_sequences"] = s.num_sequences;
    return d;
  }

 private:
  Place place_;
  std::unique_ptr<KvCache> cache_;
};

std::vector<int32_t> to_vector(std::span<const int32_t> s) { return {s.begin(), s.end()}; }

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<PyKvCache>(m, "KvCache")
      .def(nb::init<int32_t, int32_t, int32_t, int32_t, int32_t, const std::string&,
                    const std::string&, int32_t, bool>(),
           nb::arg("num_layers"), nb::arg("num_kv_heads"), nb::arg("head_dim"),
           nb::arg("page_size"), nb::arg("num_pages"), nb::arg("dtype"), nb::arg("device"),
           nb::arg("device_id"), nb::arg("enable_prefix_cache"))
      .def_prop_ro("num_layers", [](PyKvCache& c) { return c.cache().config().num_layers; })
      .def_prop_ro("num_kv_heads", [](PyKvCache& c) { return c.cache().config().num_kv_heads; })
      .def_prop_ro("head_dim", [](PyKvCache& c) { return c.cache().config().head_dim; })
      .def_prop_ro("page_size", [](PyKvCache& c) { return c.cache().config().page_size; })
      .def_prop_ro("num_pages", [](PyKvCache& c) { return c.cache().config().num_pages; })
      .def_prop_ro("dtype",
                   [](PyKvCache& c) { return std::string(dtype_name(c.cache().config().dtype)); })
      .def_prop_ro("device", [](PyKvCache& c) { return place_name(c.place()); })
      .def(
          "create_sequence",
          [](PyKvCache& c, const std::string& salt) { return c.cache().create_sequence(salt); },
          nb::arg("cache_salt") = "")
      .def(
          "attach_prefix",
          [](PyKvCache& c, SeqId seq, const std::vector<int32_t>& tokens) {
            return c.cache().attach_prefix(seq, tokens);
          },
          nb::arg("seq"), nb::arg("tokens"))
      .def(
          "pages_needed",
          [](PyKvCache& c, SeqId seq, int32_t n) { return c.cache().pages_needed(seq, n); },
          nb::arg("seq"), nb::arg("n"))
      .def(
          "can_append",
          [](PyKvCache& c, SeqId seq, int32_t n) { return c.cache().can_append(seq, n); },
          nb::arg("seq"), nb::arg("n"))
      .def(
          "append_slots",
          [](PyKvCache& c, SeqId seq, const std::vector<int32_t>& tokens) {
            return int32_array(c.cache().append_slots(seq, tokens));
          },
          nb::arg("seq"), nb::arg("tokens"))
      .def(
          "commit", [](PyKvCache& c, SeqId seq) { c.cache().commit(seq); }, nb::arg("seq"))
      .def(
          "fork", [](PyKvCache& c, SeqId seq) { return c.cache().fork(seq); }, nb::arg("seq"))
      .def(
          "free", [](PyKvCache& c, SeqId seq) { c.cache().free_sequence(seq); }, nb::arg("seq"))
      .def(
          "has_sequence", [](PyKvCache& c, SeqId seq) { return c.cache().has_sequence(seq); },
          nb::arg("seq"))
      .def(
          "kv_len", [](PyKvCache& c, SeqId seq) { return c.cache().kv_len(seq); }, nb::arg("seq"))
      .def(
          "block_table",
          [](PyKvCache& c, SeqId seq) {
            return int32_array(to_vector(c.cache().block_table(seq)));
          },
          nb::arg("seq"))
      .def(
          "tokens", [](PyKvCache& c, SeqId seq) { return to_vector(c.cache().tokens(seq)); },
          nb::arg("seq"))
      .def(
          "cache_salt", [](PyKvCache& c, SeqId seq) { return c.cache().cache_salt(seq); },
          nb::arg("seq"))
      .def(
          "refcount", [](PyKvCache& c, int32_t page) { return c.cache().refcount(page); },
          nb::arg("page"))
      .def(
          "set_scales",
          [](PyKvCache& c, int32_t layer, const std::vector<float>& k,
             const std::vector<float>& v) { c.cache().set_scales(layer, k, v); },
          nb::arg("layer"), nb::arg("k_scale"), nb::arg("v_scale"))
      .def_prop_ro("scales_set", [](PyKvCache& c) { return c.cache().scales_set(); })
      .def("pool", &PyKvCache::pool, nb::arg("layer"), nb::arg("v"), nb::arg("framework"))
      .def("scale", &PyKvCache::scale, nb::arg("layer"), nb::arg("v"), nb::arg("framework"))
      .def("pool_ptr", &PyKvCache::pool_ptr, nb::arg("layer"), nb::arg("v"))
      .def("stats", &PyKvCache::stats);
}

}  // namespace pagedattn::python
