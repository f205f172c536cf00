// Backend metadata of npu tensors (backend_meta.cpp): fields kept on the
// TensorImpl, carried by torch.save / torch.load and by shallow copies.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace npusim {

// get_backend_meta and set_backend_meta for Python (npusim.runtime.backend_meta).
void bind_backend_meta(pybind11::module_& m);

}  // namespace npusim
