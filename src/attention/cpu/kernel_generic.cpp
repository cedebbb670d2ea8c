// The fused CPU attention kernel for the build's baseline ISA (runs on any CPU).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/kernel_types.h"

namespace pagedattn::cpu {
namespace generic {
#include "cpu/kernel_body.inc"
}  // namespace generic

ItemFn select_item_fn_generic(const KernelParams& p) { return generic::select_item_fn(p); }

}  // namespace pagedattn::cpu
