// y = x w^T over weights in their file's format: activation blocks, kernel choice, tiling over the
// weight rows, and the K-quant and exact paths (quant_matmul.h).
#include "quant_matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#include "pagedattn/thread_pool.h"
#include "quant_kernels.h"
#include "quant_pack.h"

namespace pagedattn::cpu {

namespace {

using qk::ActRows;
using qk::kBlock;
using qk::kMaxRows;

// The kernel tables this CPU can run, widest first, the portable one last.
const std::vector<const qk::Kernels*>& available() {
  static const std::vector<const qk::Kernels*> list = [] {
    std::vector<const qk::Kernels*> l;
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)  // (quant_dot_x86.cpp)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
      // NOTE: AVX-512 VNNI first: a group's 16 rows in one register, and 32 registers for the
      // accumulators of 8 activation rows per pass over the weights (4 with 16).
      if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && qk::avx512vnni_kernels())
        l.push_back(qk::avx512vnni_kernels());
      if (__builtin_cpu_supports("avxvnni") && qk::avxvnni_kernels())
        l.push_back(qk::avxvnni_kernels());
      if (qk::avx2_kernels()) l.push_back(qk::avx2_kernels());
    }
#endif
    l.push_back(&qk::generic_kernels());
    return l;
  }();
  return list;
}

const qk::Kernels* by_name(const std::string& name) {
  for (const qk::Kernels* k : available())
    if (name == k->name) return k;
  return nullptr;
}

std::atomic<const qk::Kernels*> g_forced{nullptr};  // set_matmul_isa

// The widest table, or what PAGEDATTN_CPU_ISA caps it to: generic, or avx2 (no VNNI).
const qk::Kernels& kernels() {
  static const qk::Kernels* best = [] {
    const char* env = std::getenv("PAGEDATTN_CPU_ISA");
    if (env && std::string(env) == "generic") return &qk::generic_kernels();
    if (env && std::string(env) == "avx2" && by_name("avx2")) return by_name("avx2");
    return available().front();
  }();
  const qk::Kernels* forced = g_forced.load();
  return forced ? *forced : *best;
}

// The int8 kernel of a matrix (every block format, in the x16 layout); none for F32/F16/BF16,
// which take f32 activations.
struct Int8Kernel {
  qk::GroupDotFn group = nullptr;
  explicit operator bool() const { return group != nullptr; }
};

Int8Kernel int8_kernel(const WeightView& w, const qk::Kernels& k) {
  if (x16_packable(w.type))
    PA_CHECK(w.x16, "matmul: ", ggml_type_name(uint32_t(w.type)),
             " matrix is not in the x16 layout (pack it with pack_x16 first)");
  switch (w.type) {
    case GGMLType::q4_0:
      return {k.q4_0};
    case GGMLType::q4_1:
      return {k.q4_1};
    case GGMLType::q8_0:
      return {k.q8_0};
    case GGMLType::q4_k:
      return {k.q4_k};
    case GGMLType::q6_k:
      return {k.q6_k};
    case GGMLType::iq4_nl:
      return {k.iq4_nl};
    case GGMLType::q5_k:
      return {k.q5_k};
    case GGMLType::q5_0:
      return {k.q5_0};
    case GGMLType::q5_1:
      return {k.q5_1};
    default:
      return {};
  }
}

// Weight rows per tile (a parallel task) of a matrix of `rows` rows: for the int8 kernels about two
// tiles per pool thread, a whole number of x16 groups, 32 to 512 rows; 32 for the f32 path, which
// dequantises a tile into a buffer that must stay in cache.
// NOTE: a tile stays in cache while every activation row passes it, so a product of many rows
// reads each weight block from memory once per tile. Small tiles cost a claim on a shared counter
// each and restart the weight stream: with 32-row tiles a one-sequence decode step ran 172 tok/s,
// with two tiles a thread 199 (medians of five, interleaved; 2 threads).
int64_t tile_rows(int64_t rows, bool int8) {
  if (!int8) return 32;
  const int64_t tiles = 2 * int64_t(ThreadPool::global().num_threads());
  const int64_t t = (rows + tiles - 1) / tiles;
  return std::clamp<int64_t>((t + kGroupRows - 1) / kGroupRows * kGroupRows, 32, 512);
}
static_assert(32 % kGroupRows == 0 && 512 % kGroupRows == 0);

}  // namespace

void MatmulInput::set(const float* x, int64_t m, int64_t k) {
  x_ = x;
  m_ = m;
  k_ = k;
  quantized_ = false;
}

const int8_t* MatmulInput::q() {
  if (quantized_) return q_.data();
  PA_CHECK(k_ % kBlock == 0, "matmul: k = ", k_, " is not a multiple of ", kBlock,
           " (needed for int8 activations)");
  const int64_t nb = k_ / kBlock;
  q_.resize(size_t(m_ * k_));
  d_.resize(size_t(m_ * nb));
  s_.resize(size_t(m_ * nb));
  sum_.resize(size_t(m_ * nb));
  const int64_t chunks = std::min<int64_t>(m_, 64);
  const qk::QuantizeFn quantize = kernels().quantize;
  parallel_for(chunks, [&](int64_t c) {
    for (int64_t r = m_ * c / chunks; r < m_ * (c + 1) / chunks; ++r)
      quantize(x_ + r * k_, nb, q_.data() + r * k_, d_.data() + r * nb, s_.data() + r * nb,
               sum_.data() + r * nb);
  });
  quantized_ = true;
  return q_.data();
}

void weight_row(const WeightView& w, int64_t r, float* dst) {
  if (!w.x16) return dequantize_row(w.type, w.data + r * w.row_bytes, dst, w.cols);
  thread_local std::vector<uint8_t> row;
  row.resize(size_t(w.row_bytes));
  x16_file_row(w, r, row.data());
  dequantize_row(w.type, row.data(), dst, w.cols);
}

namespace {

// Tile t (tile_rows rows of w from c0) of y = x w^T.
void run_tile(MatmulInput& x, const WeightView& w, float* y, int64_t t, Int8Kernel kfn,
              const qk::Kernels& kern) {
  const int64_t m = x.m(), n = w.rows, k = w.cols, rows = tile_rows(n, bool(kfn));
  const int64_t c0 = t * rows, c1 = std::min(n, c0 + rows);
  if (kfn) {
    const int64_t nb = k / kBlock;
    for (int64_t r0 = 0; r0 < m; r0 += qk::kMaxGroupRows) {
      const int R = int(std::min<int64_t>(qk::kMaxGroupRows, m - r0));
      const ActRows a{x.q() + r0 * k, x.d() + r0 * nb, x.s() + r0 * nb, x.sum() + r0 * nb, k, nb};
      float out[qk::kMaxGroupRows * kGroupRows];
      for (int64_t g = c0 / kGroupRows; g * kGroupRows < c1; ++g) {
        kfn.group(w.data + g * kGroupRows * w.row_bytes, a, R, out);
        const int64_t rows = std::min<int64_t>(kGroupRows, n - g * kGroupRows);
        for (int r = 0; r < R; ++r)
          std::memcpy(y + (r0 + r) * n + g * kGroupRows, out + r * kGroupRows,
                      size_t(rows) * sizeof(float));
      }
    }
    return;
  }
  // f32 activations: F32 weights in place, any other format dequantised a tile at a time.
  thread_local std::vector<float> buf;
  const float* wt;
  float out[kMaxRows];
  if (w.type == GGMLType::f32) {
    wt = reinterpret_cast<const float*>(w.data + c0 * w.row_bytes);
  } else {
    buf.resize(size_t((c1 - c0) * k));
    for (int64_t c = c0; c < c1; ++c) weight_row(w, c, buf.data() + (c - c0) * k);
    wt = buf.data();
  }
  for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
    const int R = int(std::min<int64_t>(kMaxRows, m - r0));
    for (int64_t c = c0; c < c1; ++c) {
      kern.f32(wt + (c - c0) * k, x.x() + r0 * k, k, k, R, out);
      for (int r = 0; r < R; ++r) y[(r0 + r) * n + c] = out[r];
    }
  }
}

}  // namespace

void matmul(MatmulInput& x, const WeightView& w, float* y, MatmulMode mode) {
  matmul(x, {{&w, y}}, mode);
}

void matmul(MatmulInput& x, std::initializer_list<MatmulOutput> outs, MatmulMode mode) {
  const qk::Kernels& kern = kernels();
  struct Part {
    const WeightView* w;
    float* y;
    Int8Kernel kfn;
    int64_t first_tile;
  };
  std::vector<Part> parts;
  int64_t tiles = 0;
  for (const MatmulOutput& o : outs) {
    PA_CHECK(o.w->cols == x.k(), "matmul: weight has ", o.w->cols,
             " columns but x has k = ", x.k());
    const Int8Kernel kfn = mode == MatmulMode::fast ? int8_kernel(*o.w, kern) : Int8Kernel{};
    if (kfn) x.q();  // once, before the tiles share it
    parts.push_back({o.w, o.y, kfn, tiles});
    const int64_t rows = tile_rows(o.w->rows, bool(kfn));
    tiles += x.m() == 0 ? 0 : (o.w->rows + rows - 1) / rows;
  }
  if (tiles == 0) return;
  parallel_for(tiles, [&](int64_t t) {
    size_t i = parts.size() - 1;
    while (parts[i].first_tile > t) --i;
    run_tile(x, *parts[i].w, parts[i].y, t - parts[i].first_tile, parts[i].kfn, kern);
  });
}

const char* matmul_isa() { return kernels().name; }

std::vector<std::string> matmul_isas() {
  std::vector<std::string> names;
  for (const qk::Kernels* k : available()) names.push_back(k->name);
  return names;
}

void set_matmul_isa(const std::string& name) {
  if (name.empty()) return g_forced.store(nullptr);
  const qk::Kernels* k = by_name(name);
  PA_CHECK(k, "set_matmul_isa: '", name, "' is not among this CPU's kernels");
  g_forced.store(k);
}

}  // namespace pagedattn::cpu
