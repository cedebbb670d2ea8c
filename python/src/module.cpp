// The extension module pagedattn._C. The public API is the Python layer in pagedattn/ (argument
// conversion, torch streams, the torch custom op); this module is what it calls.
#include <nanobind/nanobind.h>

#include "pagedattn/error.h"

namespace nb = nanobind;

namespace pagedattn::python {
void bind_attention(nb::module_& m);
void bind_cache(nb::module_& m);
void bind_engine(nb::module_& m);
}  // namespace pagedattn::python

NB_MODULE(_C, m) {
  m.doc() = "pagedattn's C++ core (use the pagedattn package, not this module)";
  // pagedattn::Error (bad input caught by the C++ API) is a ValueError in Python.
  nb::exception<pagedattn::Error>(m, "Error", PyExc_ValueError);
#ifdef PAGEDATTN_HAVE_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  pagedattn::python::bind_attention(m);
  pagedattn::python::bind_cache(m);
  pagedattn::python::bind_engine(m);
}
