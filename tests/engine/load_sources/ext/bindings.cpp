#include <torch/extension.h>
#include "ops.h"

int cpp_flag() { return KLSP_CPP_FLAG; }  // KLSP_CPP_FLAG: from extra_cflags

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("scale_add", &scale_add, "x * s + KLSP_BIAS");
    m.def("cpp_flag", &cpp_flag);
    m.attr("ops_version") = kOpsVersion;
}
