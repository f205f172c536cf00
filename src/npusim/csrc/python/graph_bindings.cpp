// Bindings of npu graphs (aclmdlRI capture / replay).
#include "bindings.h"

#include "../graph/graph.h"

namespace py = pybind11;

namespace npusim {

void init_graph_bindings(py::module& m) {
  using release = py::call_guard<py::gil_scoped_release>;

  // graphs (aclmdlRI capture / replay; See Note [NPU graph capture])
  py::class_<npusim::NpuGraph>(m, "NpuGraph")
      .def(py::init<>())
      .def("capture_begin", [](npusim::NpuGraph& g, std::pair<uint64_t, uint64_t> pool, const std::string& mode) {
        g.capture_begin({pool.first, pool.second}, mode);
      })
      .def("capture_end", &npusim::NpuGraph::capture_end)
      .def("replay", &npusim::NpuGraph::replay, release())
      .def("reset", &npusim::NpuGraph::reset)
      .def("pool", [](const npusim::NpuGraph& g) {
        const c10::MempoolId_t id = g.pool();
        return py::make_tuple(id.first, id.second);
      })
      .def("num_tasks", &npusim::NpuGraph::num_tasks)
      .def("captured", &npusim::NpuGraph::captured)
      .def("enable_debug_mode", &npusim::NpuGraph::enable_debug_mode)
      .def("debug_dump", &npusim::NpuGraph::debug_dump);
  m.def("graph_pool_handle", [] {
    const c10::MempoolId_t id = npusim::graph_pool_handle();
    return py::make_tuple(id.first, id.second);
  });
  m.def("stream_is_capturing", [](int64_t id, int device) {
    return npusim::stream_is_capturing(npusim::stream_for(device, id));
  });
}

}  // namespace npusim
