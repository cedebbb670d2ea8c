// pdl_enabled (pdl.h).
#include <cstdlib>
#include <cstring>

#include "pdl.h"

namespace pagedattn::cuda {

bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("PAGEDATTN_PDL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

}  // namespace pagedattn::cuda
