// The CUDA model's RoPE kernels against the host: the device tables against rope_tables (rope.h)
// at positions up to 2^17, the embedding kernels' copies of the tokens' rows and embedding rows,
// and qkv_post (bias, per-head norms, rotation by the token's rows, stores into q/k/v or the page
// pools) against a double-precision host computation, for every head dim the model takes,
// poisoned outputs, slots outside the pools left alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "gpu_skip.h"
#include "model/rope.h"
#include "pagedattn/model.h"
#include "pagedattn/tensor.h"

#ifdef PAGEDATTN_HAVE_CUDA
#include "model/cuda/llama_kernels.h"
#include "pagedattn/attention_cuda.h"

using namespace pagedattn;

namespace {

template <class T>
Tensor upload(const std::vector<T>& v) {
  Tensor t = Tensor::empty({int64_t((v.size() * sizeof(T) + 3) / 4)}, DType::f32, Device::cuda);
  copy_bytes(t.data(), Device::cuda, v.data(), Device::cpu, v.size() * sizeof(T));
  return t;
}

template <class T>
std::vector<T> download(const Tensor& t, size_t n) {
  std::vector<T> v(n);
  copy_bytes(v.data(), Device::cpu, t.data(), Device::cuda, n * sizeof(T));
  return v;
}

float bf16_to_f32(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The distance from x to its farther f32 neighbour.
float ulp(float x) {
  return std::max(std::fabs(std::nextafter(x, 2.f) - x), std::fabs(std::nextafter(x, -2.f) - x));
}

// The device tables hold rope_tables' values: the same double-precision angle, cos and sin within
// one double rounding, so each f32 equals the host's or is its neighbour (a double result at an
// f32 rounding boundary); YaRN's tables times its attention factor.
TEST(LlamaCudaKernels, RopeTableIsTheHostTable) {
  PA_SKIP_WITHOUT_GPU();
  const RopeScaling llama3{.type = "llama3", .factor = 8.f};  // Llama 3's bands (the defaults)
  const RopeScaling yarn{.type = "yarn", .factor = 4.f, .original_max_position = 32768};
  for (const auto& [D, theta, scaling] :
       {std::tuple{64, 10000.f, RopeScaling{}}, std::tuple{128, 500000.f, llama3},
        std::tuple{256, 1000000.f, RopeScaling{}}, std::tuple{128, 1000000.f, yarn}}) {
    const std::vector<double> inv = rope_inv_freq(D, theta, scaling);
    const double scale = rope_attention_factor(scaling);
    const int32_t half = D / 2, rows = 1 << 17;
    Tensor dinv = upload(inv);
    Tensor table = Tensor::empty({2 * int64_t(rows) * half}, DType::f32, Device::cuda);
    auto* dcos = table.data_as<float>();
    cuda::rope_table(static_cast<const double*>(dinv.data()), half, rows, dcos,
                     dcos + int64_t(rows) * half, nullptr, scale);
    const std::vector<float> got = download<float>(table, size_t(2) * rows * half);
    std::vector<int32_t> pos = {0, 1, 2, 3, 4095, 4096, 8191, 8192, 32767, rows - 1};
    std::mt19937 rng{uint32_t(D)};
    for (int i = 0; i < 300; ++i) pos.push_back(int32_t(rng() % uint32_t(rows)));
    std::vector<float> c(pos.size() * half), s(c.size());
    rope_tables(inv, pos.data(), int32_t(pos.size()), c.data(), s.data(), scale);
    int64_t differ = 0;
    for (size_t t = 0; t < pos.size(); ++t) {
      for (int32_t i = 0; i < half; ++i) {
        const float hc = c[t * half + size_t(i)], hs = s[t * half + size_t(i)];
        const float gc = got[size_t(pos[t]) * half + size_t(i)];
        const float gs = got[(size_t(rows) + size_t(pos[t])) * half + size_t(i)];
        ASSERT_LE(std::fabs(gc - hc), ulp(hc)) << "D " << D << " position " << pos[t] << " pair "
                                                << i;
        ASSERT_LE(std::fabs(gs - hs), ulp(hs)) << "D " << D << " position " << pos[t] << " pair "
                                                << i;
        differ += (gc != hc) + (gs != hs);
      }
    }
    EXPECT_LE(differ, int64_t(pos.size()) * half / 1000) << "D " << D;
  }
}

// The embedding kernels copy each token's embedding row (zeros outside a vocabulary shard; a
// stand-in's from the chained ids) and each token's RoPE rows from the tables, bit for bit; without
// rows to copy, only x is written.
TEST(LlamaCudaKernels, EmbeddingKernelsCopyEmbeddingAndRopeRows) {
  PA_SKIP_WITHOUT_GPU();
  const int32_t vocab = 50, hidden = 96, half = 64, table_rows = 300, T = 37;
  std::mt19937 rng(5);
  std::vector<uint16_t> embed(size_t(vocab) * hidden);
  for (uint16_t& e : embed) e = uint16_t(0x3c00 + rng() % 0x0400);  // bf16 values in [1, 2)
  std::vector<float> table(size_t(2) * table_rows * half);
  for (float& v : table) v = float(int32_t(rng() % 2001) - 1000) / 1000.f;
  std::vector<int32_t> tokens(T), pos(T);
  for (int32_t t = 0; t < T; ++t) {
    tokens[size_t(t)] = int32_t(rng() % uint32_t(vocab));
    pos[size_t(t)] = int32_t(rng() % uint32_t(table_rows));
  }
  // Every third token from the ids of a pass before (chained_token(r) stands for chained[r]): the
  // whole vocabulary's kernel and the second shard's.
  std::vector<int32_t> stand_ins = tokens;
  for (int32_t t = 0; t < T; t += 3) stand_ins[size_t(t)] = chained_token(t);
  Tensor de = upload(embed), dtab = upload(table), dtok = upload(tokens), dpos = upload(pos);
  Tensor dstand = upload(stand_ins), dchained = upload(tokens);
  for (int32_t shard = -1; shard < 2; ++shard) {  // -1: the whole vocabulary; else half of it
    SCOPED_TRACE(testing::Message() << "shard " << shard);
    const int32_t vocab0 = shard < 0 ? 0 : shard * (vocab / 2);
    const int32_t vocab_rows = shard < 0 ? vocab : (shard == 0 ? vocab / 2 : vocab - vocab / 2);
    for (bool with_rows : {true, false}) {
      Tensor dx = upload(std::vector<float>(size_t(T) * hidden, std::nanf("")));
      Tensor drows = upload(std::vector<float>(size_t(2) * T * half, std::nanf("")));
      cuda::RopeRowsGather g;
      if (with_rows) {
        g.cos_table = dtab.data_as<float>();
        g.sin_table = g.cos_table + int64_t(table_rows) * half;
        g.positions = static_cast<const int32_t*>(dpos.data());
        g.half = half;
        g.cos = drows.data_as<float>();
        g.sin = g.cos + int64_t(T) * half;
      }
      const auto* ebase = static_cast<const uint16_t*>(de.data()) + int64_t(vocab0) * hidden;
      const auto* dt = static_cast<const int32_t*>(dtok.data());
      const auto* stand = static_cast<const int32_t*>(dstand.data());
      const auto* chained = static_cast<const int32_t*>(dchained.data());
      if (shard < 0)
        cuda::embed_gather(ebase, stand, chained, T, hidden, dx.data_as<float>(), g, nullptr);
      else
        cuda::embed_gather_shard(ebase, vocab0, vocab_rows, shard == 0 ? dt : stand, chained, T,
                                 hidden, dx.data_as<float>(), g, nullptr);
      const auto x = download<float>(dx, size_t(T) * hidden);
      const auto r = download<float>(drows, size_t(2) * T * half);
      for (int32_t t = 0; t < T; ++t) {
        const int32_t tok = tokens[size_t(t)];
        const bool here = tok >= vocab0 && tok < vocab0 + vocab_rows;
        for (int32_t i = 0; i < hidden; ++i) {
          const float want = here ? bf16_to_f32(embed[size_t(tok) * hidden + size_t(i)]) : 0.f;
          ASSERT_EQ(x[size_t(t) * hidden + size_t(i)], want) << "token " << t << " i " << i;
        }
        for (int32_t i = 0; i < half; ++i) {
          const size_t at = size_t(t) * half + size_t(i), from = size_t(pos[size_t(t)]) * half;
          if (!with_rows) {
            ASSERT_TRUE(std::isnan(r[at])) << "token " << t << " i " << i;
            continue;
          }
          ASSERT_EQ(r[at], table[from + size_t(i)]) << "token " << t << " i " << i;
          ASSERT_EQ(r[size_t(T) * half + at], table[size_t(table_rows) * half + from + size_t(i)])
              << "token " << t << " i " << i;
        }
      }
    }
  }
}

struct QkvCase {
  int32_t T, Hq, Hkv, D;
  bool bias, norm, to_pool;
};

// The case's shape as qkv_post's parameters (no pools, no scales).
cuda::QkvParams qkv_shape(const QkvCase& k) {
  cuda::QkvParams p;
  p.num_tokens = k.T;
  p.num_q_heads = k.Hq;
  p.num_kv_heads = k.Hkv;
  p.head_dim = k.D;
  p.eps = 1e-6f;
  return p;
}

// qkv_post against the host in double precision: bias, norm (x / rms(x) * w, per head of q and
// k), rotate_half by the table row of each token's position; bf16 outputs within one bf16
// rounding of the host's value.
TEST(LlamaCudaKernels, QkvPostIsTheHostComputation) {
  PA_SKIP_WITHOUT_GPU();
  const QkvCase cases[] = {
      {1, 4, 2, 64, false, false, false},   {7, 8, 2, 128, true, false, false},
      {33, 8, 8, 128, false, true, true},   {5, 4, 1, 256, true, true, true},
      {300, 32, 8, 128, false, false, true}, {64, 16, 4, 64, true, true, false},
      {3, 2, 2, 512, false, true, false}};
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const QkvCase& k : cases) {
    SCOPED_TRACE(testing::Message() << "T " << k.T << " Hq " << k.Hq << " Hkv " << k.Hkv << " D "
                                    << k.D << " bias " << k.bias << " norm " << k.norm
                                    << " pool " << k.to_pool);
    const int32_t heads = k.Hq + 2 * k.Hkv, width = heads * k.D, half = k.D / 2;
    const int32_t rows = 4096;
    const std::vector<double> inv = rope_inv_freq(k.D, 500000.f, RopeScaling{});
    std::vector<float> qkv(size_t(k.T) * size_t(width)), bias(static_cast<size_t>(width)),
        qn(static_cast<size_t>(k.D)), kn(static_cast<size_t>(k.D));
    for (float& x : qkv) x = 3.f * nd(rng);
    for (float& x : bias) x = nd(rng);
    for (float& x : qn) x = 1.f + 0.3f * nd(rng);
    for (float& x : kn) x = 1.f + 0.3f * nd(rng);
    const int32_t page = 16, pages = (k.T + page - 1) / page + 2;
    std::vector<int32_t> pos(size_t(k.T)), slots(size_t(pages * page));
    for (size_t j = 0; j < slots.size(); ++j) slots[j] = int32_t(j);
    std::shuffle(slots.begin(), slots.end(), rng);  // distinct slots in any order
    slots.resize(size_t(k.T));
    for (int32_t t = 0; t < k.T; ++t) {
      pos[size_t(t)] = int32_t(rng() % uint32_t(rows));
      if (t % 5 == 3) slots[size_t(t)] = -1;  // some slots skipped
    }
    if (k.T > 1) slots[1] = pages * page;  // past the pools: skipped too
    Tensor dqkv = upload(qkv), dbias = upload(bias), dqn = upload(qn), dkn = upload(kn),
           dslots = upload(slots), dinv = upload(inv);
    Tensor table = Tensor::empty({2 * int64_t(rows) * half}, DType::f32, Device::cuda);
    auto* cos = table.data_as<float>();
    cuda::rope_table(static_cast<const double*>(dinv.data()), half, rows, cos,
                     cos + int64_t(rows) * half, nullptr);
    const std::vector<float> tab = download<float>(table, size_t(2) * rows * half);
    std::vector<float> tok_rows(size_t(2) * k.T * half);  // each token's cos, then sin rows
    for (int32_t t = 0; t < k.T; ++t)
      for (int32_t i = 0; i < half; ++i) {
        tok_rows[size_t(t) * half + size_t(i)] = tab[size_t(pos[size_t(t)]) * half + size_t(i)];
        tok_rows[(size_t(k.T) + size_t(t)) * half + size_t(i)] =
            tab[(size_t(rows) + size_t(pos[size_t(t)])) * half + size_t(i)];
      }
    Tensor drows = upload(tok_rows);
    const size_t nq = size_t(k.T) * k.Hq * k.D, nkv = size_t(k.T) * k.Hkv * k.D;
    const size_t npool = size_t(pages) * k.Hkv * page * k.D;
    const std::vector<uint16_t> poison(std::max(nq, npool), 0x7fc1);  // NaN
    Tensor dq = upload(std::vector<uint16_t>(poison.begin(), poison.begin() + long(nq)));
    Tensor dk = upload(std::vector<uint16_t>(poison.begin(), poison.begin() + long(nkv)));
    Tensor dv = upload(std::vector<uint16_t>(poison.begin(), poison.begin() + long(nkv)));
    Tensor kpool = upload(std::vector<uint16_t>(poison.begin(), poison.begin() + long(npool)));
    Tensor vpool = upload(std::vector<uint16_t>(poison.begin(), poison.begin() + long(npool)));
    cuda::QkvParams p = qkv_shape(k);
    if (k.to_pool) {
      p.k_pool = static_cast<uint16_t*>(kpool.data());
      p.v_pool = static_cast<uint16_t*>(vpool.data());
      p.slots = static_cast<const int32_t*>(dslots.data());
      p.page_size = page;
      p.num_pages = pages;
    }
    cuda::qkv_post(dqkv.data_as<float>(), k.bias ? dbias.data_as<float>() : nullptr,
                   k.norm ? dqn.data_as<float>() : nullptr, k.norm ? dkn.data_as<float>() : nullptr,
                   drows.data_as<float>(), drows.data_as<float>() + int64_t(k.T) * half, p,
                   static_cast<uint16_t*>(dq.data()), static_cast<uint16_t*>(dk.data()),
                   static_cast<uint16_t*>(dv.data()), nullptr);
    const auto q = download<uint16_t>(dq, nq);
    const auto kk = download<uint16_t>(dk, nkv), vv = download<uint16_t>(dv, nkv);
    const auto kp = download<uint16_t>(kpool, npool), vp = download<uint16_t>(vpool, npool);
    std::vector<bool> k_written(npool, false), v_written(npool, false);
    for (int32_t t = 0; t < k.T; ++t) {
      for (int32_t h = 0; h < heads; ++h) {
        std::vector<double> x(size_t(k.D));
        for (int32_t i = 0; i < k.D; ++i)
          x[size_t(i)] = double(qkv[size_t(t) * width + size_t(h) * k.D + size_t(i)]) +
                         (k.bias ? double(bias[size_t(h) * k.D + size_t(i)]) : 0.0);
        const bool is_q = h < k.Hq, is_k = !is_q && h < k.Hq + k.Hkv;
        if ((is_q || is_k) && k.norm) {
          double ss = 0;
          for (double a : x) ss += a * a;
          const double r = 1.0 / std::sqrt(ss / k.D + 1e-6);
          for (int32_t i = 0; i < k.D; ++i) x[size_t(i)] *= r * (is_q ? qn : kn)[size_t(i)];
        }
        if (is_q || is_k) {
          const size_t row = size_t(pos[size_t(t)]) * half;
          for (int32_t i = 0; i < half; ++i) {
            const double c = tab[row + size_t(i)], s = tab[size_t(rows) * half + row + size_t(i)];
            const double a = x[size_t(i)], b = x[size_t(i + half)];
            x[size_t(i)] = a * c - b * s;
            x[size_t(i + half)] = b * c + a * s;
          }
        }
        const uint16_t* got;
        if (is_q) {
          got = &q[(size_t(t) * k.Hq + size_t(h)) * k.D];
        } else {
          const int32_t kvh = is_k ? h - k.Hq : h - k.Hq - k.Hkv;
          if (k.to_pool) {
            const int32_t slot = slots[size_t(t)];
            if (slot < 0 || slot >= pages * page) continue;
            const size_t at = (size_t(slot / page) * k.Hkv + size_t(kvh)) * page * k.D +
                              size_t(slot % page) * k.D;
            got = &(is_k ? kp : vp)[at];
            for (int32_t i = 0; i < k.D; ++i) (is_k ? k_written : v_written)[at + size_t(i)] = true;
          } else {
            got = &(is_k ? kk : vv)[(size_t(t) * k.Hkv + size_t(kvh)) * k.D];
          }
        }
        for (int32_t i = 0; i < k.D; ++i) {
          const double want = x[size_t(i)], g = bf16_to_f32(got[i]);
          // bf16 keeps 8 significant bits; the f32 math before it adds a little.
          ASSERT_NEAR(g, want, std::fabs(want) * (1.0 / 256 + 1e-5) + 1e-5)
              << "token " << t << " head " << h << " i " << i;
        }
      }
    }
    if (k.to_pool) {  // nothing else of the pools was written (skipped slots included)
      for (size_t e = 0; e < npool; ++e) {
        if (!k_written[e]) {
          ASSERT_EQ(kp[e], 0x7fc1) << "K pool element " << e;
        }
        if (!v_written[e]) {
          ASSERT_EQ(vp[e], 0x7fc1) << "V pool element " << e;
        }
      }
    }
  }
}

// qkv_post into fp8 pools (the decode step's K/V store, one launch) against its bf16 k and v
// stored by write_kv_cuda (the path of other dtypes): every byte of both pools the same, the
// skipped slots included, at each head size and with bias and norms.
TEST(LlamaCudaKernels, QkvPostIntoFp8PoolsStoresWhatWriteKvStores) {
  PA_SKIP_WITHOUT_GPU();
  const QkvCase cases[] = {{5, 4, 2, 64, false, false, true},
                           {33, 8, 2, 128, true, true, true},
                           {17, 4, 1, 256, false, true, true},
                           {3, 2, 2, 512, true, false, true}};
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const QkvCase& k : cases) {
    SCOPED_TRACE(testing::Message() << "T " << k.T << " Hkv " << k.Hkv << " D " << k.D);
    const int32_t heads = k.Hq + 2 * k.Hkv, width = heads * k.D, half = k.D / 2;
    std::vector<float> qkv(size_t(k.T) * size_t(width)), bias(static_cast<size_t>(width)),
        qn(static_cast<size_t>(k.D)), kn(static_cast<size_t>(k.D)),
        rows(size_t(2) * k.T * half), ks(static_cast<size_t>(k.Hkv)),
        vs(static_cast<size_t>(k.Hkv));
    for (float& x : qkv) x = 3.f * nd(rng);
    for (float& x : bias) x = nd(rng);
    for (float& x : qn) x = 1.f + 0.3f * nd(rng);
    for (float& x : kn) x = 1.f + 0.3f * nd(rng);
    for (int32_t t = 0; t < k.T; ++t)  // each token's cos and sin rows of some angle
      for (int32_t i = 0; i < half; ++i) {
        const double a = 0.37 * (t + 1) * (i + 1);
        rows[size_t(t) * half + size_t(i)] = float(std::cos(a));
        rows[(size_t(k.T) + size_t(t)) * half + size_t(i)] = float(std::sin(a));
      }
    // Scales of a few sizes: some values saturate at 448, some round to zero.
    for (int32_t h = 0; h < k.Hkv; ++h) ks[size_t(h)] = 0.004f * (h + 1), vs[size_t(h)] = 0.02f;
    const int32_t page = 16, pages = (k.T + page - 1) / page + 2;
    std::vector<int32_t> slots(size_t(pages * page));
    for (size_t j = 0; j < slots.size(); ++j) slots[j] = int32_t(j);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(size_t(k.T));
    for (int32_t t = 0; t < k.T; ++t)
      if (t % 5 == 3) slots[size_t(t)] = -1;  // skipped
    if (k.T > 1) slots[1] = pages * page;     // past the pools: skipped too
    Tensor dqkv = upload(qkv), dbias = upload(bias), dqn = upload(qn), dkn = upload(kn),
           drows = upload(rows), dslots = upload(slots), dks = upload(ks), dvs = upload(vs);
    const size_t nq = size_t(k.T) * k.Hq * k.D, nkv = size_t(k.T) * k.Hkv * k.D;
    const size_t npool = size_t(pages) * k.Hkv * page * k.D;
    const std::vector<uint8_t> poison(npool, 0x5a);
    Tensor dq = upload(std::vector<uint16_t>(nq)), dk = upload(std::vector<uint16_t>(nkv)),
           dv = upload(std::vector<uint16_t>(nkv));
    Tensor pools[2][2];  // [path][k, v]
    for (auto& path : pools)
      for (Tensor& t : path) t = upload(poison);
    cuda::QkvParams p = qkv_shape(k);
    auto run = [&](const cuda::QkvParams& params) {
      cuda::qkv_post(dqkv.data_as<float>(), k.bias ? dbias.data_as<float>() : nullptr,
                     k.norm ? dqn.data_as<float>() : nullptr,
                     k.norm ? dkn.data_as<float>() : nullptr, drows.data_as<float>(),
                     drows.data_as<float>() + int64_t(k.T) * half, params,
                     static_cast<uint16_t*>(dq.data()), static_cast<uint16_t*>(dk.data()),
                     static_cast<uint16_t*>(dv.data()), nullptr);
    };
    // Path 0: bf16 k and v, then write_kv into the fp8 pools.
    run(p);
    PagedKVView view;
    view.k_pages = pools[0][0].data();
    view.v_pages = pools[0][1].data();
    view.dtype = DType::fp8_e4m3;
    view.num_pages = pages;
    view.num_kv_heads = k.Hkv;
    view.page_size = page;
    view.head_dim = k.D;
    view.k_scale = dks.data_as<float>();
    view.v_scale = dvs.data_as<float>();
    write_kv_cuda(view, static_cast<const int32_t*>(dslots.data()), k.T, dk.data(), dv.data(),
                  DType::bf16, nullptr);
    // Path 1: straight into the pools.
    cuda::QkvParams direct = p;
    direct.k_pool = pools[1][0].data();
    direct.v_pool = pools[1][1].data();
    direct.fp8 = true;
    direct.k_scale = view.k_scale;
    direct.v_scale = view.v_scale;
    direct.slots = static_cast<const int32_t*>(dslots.data());
    direct.page_size = page;
    direct.num_pages = pages;
    run(direct);
    // The bytes of the tokens' slots (the others must keep the poison).
    std::vector<bool> slot_byte(npool, false);
    size_t expected = 0;
    for (int32_t slot : slots) {
      if (slot < 0 || slot >= pages * page) continue;
      for (int32_t h = 0; h < k.Hkv; ++h) {
        const size_t at = (size_t(slot / page) * k.Hkv + size_t(h)) * page * k.D +
                          size_t(slot % page) * k.D;
        for (int32_t i = 0; i < k.D; ++i) slot_byte[at + size_t(i)] = true;
        expected += size_t(k.D);
      }
    }
    size_t written = 0;
    for (int kv = 0; kv < 2; ++kv) {
      const auto want = download<uint8_t>(pools[0][kv], npool);
      const auto got = download<uint8_t>(pools[1][kv], npool);
      for (size_t e = 0; e < npool; ++e) {
        ASSERT_EQ(got[e], want[e]) << (kv ? "V" : "K") << " pool byte " << e;
        if (!slot_byte[e]) {
          ASSERT_EQ(got[e], 0x5a) << (kv ? "V" : "K") << " pool byte " << e << " outside a slot";
        }
        written += slot_byte[e] && got[e] != 0x5a;
      }
    }
    // (A value may store as the poison's byte by chance: most do not.)
    EXPECT_GT(written, 2 * expected * 9 / 10) << "of " << 2 * expected << " bytes";
  }
}

// interleave_rope_rows against the host's permutation (row 2 j + e of a head from row
// j + e D / 2), and qkv_post reading a qkv in that order (p.interleaved) against qkv_post on the
// heads' own order: q, k, v and both pools the same bits, with bias, norms and fp8 pools. And the
// projections it refuses.
TEST(LlamaCudaKernels, InterleavedRopeRowsGiveTheSameQkv) {
  PA_SKIP_WITHOUT_GPU();
  const QkvCase cases[] = {{5, 4, 2, 64, true, false, true},  {33, 8, 2, 128, false, true, false},
                           {17, 4, 1, 256, true, true, true}, {3, 2, 2, 512, false, false, true},
                           {64, 32, 8, 128, true, false, true}};
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const QkvCase& k : cases) {
    for (const bool fp8 : {false, true}) {
      if (fp8 && !k.to_pool) continue;
      SCOPED_TRACE(testing::Message() << "T " << k.T << " Hq " << k.Hq << " Hkv " << k.Hkv
                                      << " D " << k.D << " fp8 " << fp8);
      const int32_t heads = k.Hq + 2 * k.Hkv, width = heads * k.D, half = k.D / 2;
      // The weights: interleaved on the device, against the host's permutation.
      const int32_t cols = 40;
      std::vector<uint16_t> w(size_t(width) * cols);
      for (uint16_t& x : w) x = f32_to_bf16(nd(rng));
      Tensor dw = upload(w), dwi = upload(std::vector<uint16_t>(w.size(), 0x7fc1));
      cuda::interleave_rope_rows(static_cast<const uint16_t*>(dw.data()),
                                 static_cast<uint16_t*>(dwi.data()), width, cols, k.D, nullptr);
      const auto wi = download<uint16_t>(dwi, w.size());
      for (int32_t r = 0; r < width; ++r) {
        const int32_t head = r / k.D, j = (r % k.D) / 2, e = r % 2;
        const int32_t from = head * k.D + j + e * half;
        for (int32_t c = 0; c < cols; ++c)
          ASSERT_EQ(wi[size_t(r) * cols + size_t(c)], w[size_t(from) * cols + size_t(c)])
              << "row " << r << " column " << c;
      }
      // A qkv and the same values in the interleaved order.
      std::vector<float> qkv(size_t(k.T) * size_t(width)), qkvi(qkv.size()),
          bias(static_cast<size_t>(width)), qn(static_cast<size_t>(k.D)),
          kn(static_cast<size_t>(k.D)), rows(size_t(2) * k.T * half),
          scales(size_t(2) * k.Hkv);
      for (float& x : qkv) x = 3.f * nd(rng);
      for (float& x : bias) x = nd(rng);
      for (float& x : qn) x = 1.f + 0.3f * nd(rng);
      for (float& x : kn) x = 1.f + 0.3f * nd(rng);
      for (float& x : rows) x = nd(rng);
      for (int32_t h = 0; h < 2 * k.Hkv; ++h) scales[size_t(h)] = 0.01f * (h + 1);
      for (int32_t t = 0; t < k.T; ++t)
        for (int32_t h = 0; h < heads; ++h)
          for (int32_t i = 0; i < k.D; ++i) {
            const size_t at = size_t(t) * width + size_t(h) * k.D;
            qkvi[at + size_t(2 * (i % half) + i / half)] = qkv[at + size_t(i)];
          }
      const int32_t page = 16, pages = (k.T + page - 1) / page + 1;
      std::vector<int32_t> slots(size_t(pages * page));
      for (size_t j = 0; j < slots.size(); ++j) slots[j] = int32_t(j);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(size_t(k.T));
      if (k.T > 3) slots[3] = -1;
      Tensor dqkv[2] = {upload(qkv), upload(qkvi)};
      Tensor dbias = upload(bias), dqn = upload(qn), dkn = upload(kn), drows = upload(rows),
             dslots = upload(slots), dscales = upload(scales);
      const size_t nq = size_t(k.T) * k.Hq * k.D, nkv = size_t(k.T) * k.Hkv * k.D;
      const size_t npool = size_t(pages) * k.Hkv * page * k.D * (fp8 ? 1 : 2);
      Tensor out[2][5];  // [order][q, k, v, k pool, v pool]
      for (auto& o : out) {
        o[0] = upload(std::vector<uint16_t>(nq, 0x7fc1));
        o[1] = upload(std::vector<uint16_t>(nkv, 0x7fc1));
        o[2] = upload(std::vector<uint16_t>(nkv, 0x7fc1));
        o[3] = upload(std::vector<uint8_t>(npool, 0x5a));
        o[4] = upload(std::vector<uint8_t>(npool, 0x5a));
      }
      for (int order = 0; order < 2; ++order) {
        cuda::QkvParams p = qkv_shape(k);
        p.interleaved = order == 1;
        if (k.to_pool) {
          p.k_pool = out[order][3].data();
          p.v_pool = out[order][4].data();
          p.fp8 = fp8;
          p.k_scale = dscales.data_as<float>();
          p.v_scale = dscales.data_as<float>() + k.Hkv;
          p.slots = static_cast<const int32_t*>(dslots.data());
          p.page_size = page;
          p.num_pages = pages;
        }
        cuda::qkv_post(dqkv[order].data_as<float>(), k.bias ? dbias.data_as<float>() : nullptr,
                       k.norm ? dqn.data_as<float>() : nullptr,
                       k.norm ? dkn.data_as<float>() : nullptr, drows.data_as<float>(),
                       drows.data_as<float>() + int64_t(k.T) * half, p,
                       static_cast<uint16_t*>(out[order][0].data()),
                       static_cast<uint16_t*>(out[order][1].data()),
                       static_cast<uint16_t*>(out[order][2].data()), nullptr);
      }
      const char* names[5] = {"q", "k", "v", "K pool", "V pool"};
      for (int o = 0; o < 5; ++o) {
        const size_t bytes = o == 0 ? nq * 2 : o < 3 ? nkv * 2 : npool;
        const auto want = download<uint8_t>(out[0][o], bytes);
        const auto got = download<uint8_t>(out[1][o], bytes);
        size_t changed = 0;
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(got[i], want[i]) << names[o] << " byte " << i;
          changed += o >= 3 ? got[i] != 0x5a : got[i] != (i % 2 ? 0x7f : 0xc1);
        }
        // Written where qkv_post writes: q always, k and v without pools, the pools with them
        // (the slots of every token but token 3).
        const bool written = o == 0 || (o < 3) != k.to_pool;
        const size_t slot_bytes = size_t(k.T - (k.T > 3 ? 1 : 0)) * k.Hkv * k.D * (fp8 ? 1 : 2);
        if (written) EXPECT_GT(changed, (o < 3 ? bytes : slot_bytes) / 2) << names[o];
        if (!written) EXPECT_EQ(changed, 0u) << names[o];
      }
    }
  }
  Tensor a = upload(std::vector<uint16_t>(size_t(3) * 128 * 8));
  auto* pa = static_cast<uint16_t*>(a.data());
  EXPECT_THROW(cuda::interleave_rope_rows(pa, pa + 8, 3 * 128 - 1, 4, 128, nullptr), Error);
  EXPECT_THROW(cuda::interleave_rope_rows(pa, pa, 128, 8, 128, nullptr), Error);
  EXPECT_THROW(cuda::interleave_rope_rows(pa, pa + 8, 126, 4, 63, nullptr), Error);
}

}  // namespace
#endif
