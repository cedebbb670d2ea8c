// KvCache swap with the pools on a CUDA device: the copy kernel moves each page's bytes to
// page-locked host memory and back, checked byte for byte against the pools read back with
// cudaMemcpy (random bytes, odd head dims that force the kernel's byte path, long sequences).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "gpu_skip.h"
#include "pagedattn/kv_cache.h"

using namespace pagedattn;

namespace {

std::vector<uint8_t> download(const void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  copy_bytes(h.data(), Device::cpu, p, Device::cuda, bytes);
  return h;
}

void fill_random(KvCache& cache, std::mt19937_64& rng) {
  const KvCacheConfig& c = cache.config();
  const size_t bytes = size_t(c.num_pages) * c.num_kv_heads * c.page_size * c.head_dim *
                       dtype_size(c.dtype);
  std::vector<uint8_t> h(bytes);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const PagedKVView v = cache.layer_view(l);
    for (void* pool : {v.k_pages, v.v_pages}) {
      for (auto& b : h) b = uint8_t(rng());
      copy_bytes(pool, Device::cuda, h.data(), Device::cpu, bytes);
    }
  }
}

// The bytes of every page of seq, [page][layer][K, V][page bytes]: the swapped layout.
std::vector<uint8_t> pages_of(const KvCache& cache, SeqId seq) {
  const KvCacheConfig& c = cache.config();
  const size_t pb = size_t(c.num_kv_heads) * c.page_size * c.head_dim * dtype_size(c.dtype);
  std::vector<uint8_t> out;
  for (int32_t page : cache.block_table(seq)) {
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const PagedKVView v = cache.layer_view(l);
      for (const void* pool : {v.k_pages, v.v_pages}) {
        const std::vector<uint8_t> b =
            download(static_cast<const uint8_t*>(pool) + size_t(page) * pb, pb);
        out.insert(out.end(), b.begin(), b.end());
      }
    }
  }
  return out;
}

}  // namespace

TEST(CudaKvSwap, PagesComeBackByteForByte) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(11);
  struct Shape {
    int32_t layers, heads, page, dim;
    DType dtype;
    int32_t tokens;
  };
  for (const Shape& s : {Shape{4, 8, 16, 128, DType::bf16, 1000}, Shape{3, 3, 16, 64, DType::bf16, 37},
                         Shape{2, 1, 8, 3, DType::fp8_e4m3, 77}, Shape{2, 2, 1, 5, DType::f16, 9},
                         Shape{30, 3, 16, 64, DType::f32, 513}}) {
    SCOPED_TRACE(::testing::Message() << s.layers << "x" << s.heads << "x" << s.page << "x"
                                      << s.dim << " " << dtype_name(s.dtype) << " " << s.tokens);
    KvCacheConfig c;
    c.num_layers = s.layers;
    c.num_kv_heads = s.heads;
    c.head_dim = s.dim;
    c.page_size = s.page;
    c.num_pages = (s.tokens + s.page - 1) / s.page + 8;
    c.dtype = s.dtype;
    c.device = Device::cuda;
    // NOTE: off, so that swap_in copies every page back (the test overwrites the pools behind the
    // cache's back, the prefix cache's pages included).
    c.enable_prefix_cache = false;
    KvCache cache(c);
    if (s.dtype == DType::fp8_e4m3) {
      const std::vector<float> one(size_t(s.heads), 1.f);
      for (int32_t l = 0; l < s.layers; ++l) cache.set_scales(l, one, one);
    }
    fill_random(cache, rng);
    // A short sequence first so that the long one's pages do not start at page 0.
    const SeqId pad = cache.create_sequence();
    cache.append_slots(pad, std::vector<int32_t>(size_t(s.page) * 3, 1));
    std::vector<int32_t> toks(size_t(s.tokens));
    for (auto& t : toks) t = int32_t(rng() % 50000);
    const SeqId a = cache.create_sequence();
    cache.append_slots(a, toks);
    cache.commit(a);
    const std::vector<uint8_t> before = pages_of(cache, a);

    const SwappedKv kv = cache.swap_out(a);
    ASSERT_EQ(kv.bytes, before.size());
    ASSERT_TRUE(kv.pages);
    std::vector<uint8_t> host;
    const size_t page_bytes = kv.pages->empty() ? 0 : kv.bytes / kv.pages->size();
    for (const uint8_t* p : *kv.pages) host.insert(host.end(), p, p + page_bytes);
    EXPECT_TRUE(host == before) << "swap_out: host bytes differ from the pages";
    cache.free_sequence(pad);
    fill_random(cache, rng);  // every page overwritten
    const SeqId b = cache.swap_in(kv);
    // Again, from host pages that an earlier swap gave back to the pool.
    const SwappedKv again = cache.swap_out(b);
    fill_random(cache, rng);
    const SeqId b2 = cache.swap_in(again);
    EXPECT_TRUE(pages_of(cache, b2) == before) << "second swap: pages differ";
    cache.free_sequence(b2);
    const SeqId b3 = cache.swap_in(kv);
    EXPECT_EQ(std::vector<int32_t>(cache.tokens(b3).begin(), cache.tokens(b3).end()), toks);
    const std::vector<uint8_t> after = pages_of(cache, b3);
    ASSERT_EQ(after.size(), before.size());
    EXPECT_TRUE(after == before) << "swap_in: pages differ from what was swapped out";
  }
}
