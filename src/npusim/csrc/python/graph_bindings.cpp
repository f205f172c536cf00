// Bindings of npu graphs (aclmdlRI capture / replay).
#include "bindings.h"

#include "../graph/graph.h"

#include <torch/csrc/Exceptions.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace npusim {
namespace {

// A new storage over the memory of npu tensor `t`'s storage that keeps that
// storage alive (see in_new_storages below).
c10::Storage storage_aliasing(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, op, ": expected an npu tensor, got one on ",
      t.device());
  const c10::Storage base = t.storage();
  auto* keep_alive = new c10::Storage(base);
  c10::DataPtr data(const_cast<void*>(base.data()), keep_alive,
      [](void* ctx) { delete static_cast<c10::Storage*>(ctx); }, base.device());
  return c10::Storage(c10::Storage::use_byte_size_t(), base.nbytes(), std::move(data),
      /*allocator=*/nullptr, /*resizable=*/false);
}

}  // namespace

void init_graph_bindings(py::module& m) {
  using release = py::call_guard<py::gil_scoped_release>;

  // graphs (aclmdlRI capture / replay; See Note [NPU graph capture]). Python's
  // NPUGraph subclasses this class, so get_currently_capturing_graph returns the
  // user's NPUGraph object (pybind finds the instance that owns the graph).
  py::class_<npusim::NpuGraph>(m, "NpuGraph")
      .def(py::init<>())
      .def("capture_begin", [](npusim::NpuGraph& g, std::pair<uint64_t, uint64_t> pool, const std::string& mode) {
        g.capture_begin({pool.first, pool.second}, mode);
      })
      // TORCH_WARN as Python warnings (an empty graph, debug_dump without debug mode)
      .def("capture_end", torch::wrap_pybind_function([](npusim::NpuGraph& g) { g.capture_end(); }))
      .def("replay", &npusim::NpuGraph::replay, release())
      .def("reset", &npusim::NpuGraph::reset)
      .def("pool", [](const npusim::NpuGraph& g) {
        const c10::MempoolId_t id = g.pool();
        return py::make_tuple(id.first, id.second);
      })
      .def("num_tasks", &npusim::NpuGraph::num_tasks)
      .def("replay_levels", &npusim::NpuGraph::replay_levels)
      .def("captured", &npusim::NpuGraph::captured)
      .def("enable_debug_mode", &npusim::NpuGraph::enable_debug_mode)
      .def("debug_dump", torch::wrap_pybind_function(
          [](const npusim::NpuGraph& g, const std::string& path) { g.debug_dump(path); }))
      .def("register_generator_state", &npusim::NpuGraph::register_generator_state)
      .def_static("get_currently_capturing_graph", &npusim::NpuGraph::get_currently_capturing_graph,
          py::return_value_policy::reference);
  m.def("graph_pool_handle", [] {
    const c10::MempoolId_t id = npusim::graph_pool_handle();
    return py::make_tuple(id.first, id.second);
  });
  m.def("stream_is_capturing", [](int64_t id, int device) {
    return npusim::stream_is_capturing(npusim::stream_for(device, id));
  });

  // A graph tree's outputs (compile/graph_trees.py) are tensors over a storage
  // of their own that aliases the node's static output memory (as CUDA's trees
  // rebuild outputs from data pointers): marking them overwritten must not mark
  // the node's static outputs. The new storage keeps the old one alive, so the
  // memory outlives the tree if the output does. Each tensor of `tensors` gets
  // its geometry over such a storage, in one call (a replay hands its outputs
  // out this way each step); tensors of one storage share the new one, so
  // outputs that alias each other still do.
  m.def("in_new_storages", [](const std::vector<at::Tensor>& tensors) {
    std::vector<std::pair<const void*, c10::Storage>> fresh;
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      const void* key = t.storage().data();
      auto it = std::find_if(fresh.begin(), fresh.end(), [key](const auto& f) { return f.first == key; });
      if (it == fresh.end()) {
        it = fresh.emplace(fresh.end(), key, storage_aliasing(t, "in_new_storages"));
      }
      out.push_back(at::empty({0}, t.options()).set_(it->second, t.storage_offset(), t.sizes(), t.strides()));
    }
    return out;
  });
  // torch._C._set_storage_access_error_msg of CUDA builds: every later access
  // of the storage's data raises `message` (an overwritten graph-tree output).
  m.def("set_storage_access_error", [](const at::Tensor& t, std::string message) {
    t.storage().unsafeGetStorageImpl()->release_data_and_set_meta_custom_data_ptr_error_msg_(std::move(message));
  });
}

}  // namespace npusim
