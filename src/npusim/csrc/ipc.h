// npu tensors shared between processes (ipc.cpp): their memory moved into
// POSIX shared memory, and mapped again by the receiving process.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace npusim {

// share_npu_storage and open_shared_npu_storage for Python (npusim.runtime.ipc).
void bind_ipc(pybind11::module_& m);

}  // namespace npusim
