// The fused CPU attention kernel for the build's baseline ISA (runs on any CPU).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/kernel_types.h"

namespace pagedattn::cpu {
namespace generic {
#define PA_VEC_BYTES 16
#define PA_HAVE_F16C 0
#include "cpu/kernel_body.inc"
#undef PA_HAVE_F16C
#undef PA_VEC_BYTES
}  // namespace generic

ItemFn select_item_fn_generic(const KernelParams& p) { return generic::select_item_fn(p); }

}  // namespace pagedattn::cpu
