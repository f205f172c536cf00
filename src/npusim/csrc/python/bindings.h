// The bindings of npusim_C, split per area as torch/csrc/cuda splits its own:
// each init_<area>_bindings(m) adds one area's calls to the module, and
// module.cpp's PYBIND11_MODULE calls them in turn. Calls that can wait on a
// stream release the GIL: stream workers may need it to destroy tensors.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace npusim {

void init_runtime_bindings(pybind11::module& m);
void init_memory_bindings(pybind11::module& m);
void init_observer_bindings(pybind11::module& m);
void init_graph_bindings(pybind11::module& m);
void init_graphed_bindings(pybind11::module& m);
void init_ops_bindings(pybind11::module& m);

}  // namespace npusim
