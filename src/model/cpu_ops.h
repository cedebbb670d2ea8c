// fp32 building blocks of the CPU forward pass. Row-major, contiguous, host pointers.
#pragma once

#include <cstdint>

namespace pagedattn::cpu {

// y = x w^T:  x [m, k], w [n, k] (a PyTorch Linear weight), y [m, n].
// BLAS sgemm when the build has it, else matmul_wt_blocked.
void matmul_wt(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y);
// The portable version: blocked over rows and columns, parallel over column blocks. Each output
// is one dot product in a fixed order, so a row's result does not depend on m.
void matmul_wt_blocked(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y);
// True when matmul_wt goes to BLAS.
bool have_blas();

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight:  x, y [rows, dim] (may alias), weight [dim].
void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y);

// y[r] += bias:  y [rows, dim], bias [dim].
void add_bias(float* y, const float* bias, int64_t rows, int64_t dim);

// x += y, elementwise over n.
void add_inplace(float* x, const float* y, int64_t n);

// gate = silu(gate) * up, elementwise over n (silu(g) = g / (1 + exp(-g))).
void silu_mul(float* gate, const float* up, int64_t n);

}  // namespace pagedattn::cpu
