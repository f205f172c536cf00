// The Python module of the device core (npusim._C): one init per area
// (bindings.h), the only place the floors below meet Python.
#include "bindings.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  npusim::init_runtime_bindings(m);
  npusim::init_memory_bindings(m);
  npusim::init_observer_bindings(m);
  npusim::init_graph_bindings(m);
  npusim::init_graphed_bindings(m);
  npusim::init_ops_bindings(m);
}
