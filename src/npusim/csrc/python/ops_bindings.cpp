// Bindings of the aten floor: device registration, the fallback routes, the
// generator, the ACL-like primitives and the native _foreach_copy_ kernel.
#include "bindings.h"

#include "../aten/device_hooks.h"
#include "../aten/fallback.h"
#include "../aten/foreach_copy.h"
#include "../aten/generator.h"
#include "../aten/host_transfer.h"
#include "../aten/op_launch.h"
#include "../aten/primitives.h"

#include <torch/csrc/jit/python/pybind_utils.h>

namespace py = pybind11;

namespace npusim {
namespace {

// The Python cost function behind the compute-cost hook (op_launch.h);
// leaked: the hook may be called while the interpreter shuts down.
py::object& compute_cost_function() {
  static auto* fn = new py::object();
  return *fn;
}

double call_compute_cost_function(const c10::OperatorHandle& op, const std::vector<c10::IValue>& meta_inputs,
    const std::vector<c10::IValue>& meta_outputs) {
  py::gil_scoped_acquire gil;
  py::list inputs;
  for (const c10::IValue& v : meta_inputs) {
    inputs.append(torch::jit::toPyObject(v));
  }
  py::list outputs;
  for (const c10::IValue& v : meta_outputs) {
    outputs.append(torch::jit::toPyObject(v));
  }
  const c10::OperatorName& name = op.schema().operator_name();
  return compute_cost_function()(name.name, name.overload_name, inputs, outputs).cast<double>();
}

}  // namespace

void init_ops_bindings(py::module& m) {
  using release = py::call_guard<py::gil_scoped_release>;

  m.def("register_device", &npusim::register_device);
  m.def("route_structured_ops_to_fallback", &npusim::route_structured_ops_to_fallback);

  // the compute-cost hook of the timing model (op_launch.h): fn(name, overload, meta_inputs,
  // meta_outputs) -> microseconds, or None to remove it
  m.def("set_compute_cost", [](py::object fn) {
    if (fn.is_none()) {
      npusim::set_compute_cost_hook(nullptr);
      compute_cost_function() = py::object();
      return;
    }
    compute_cost_function() = std::move(fn);
    npusim::set_compute_cost_hook(&call_compute_cost_function);
  });

  // random numbers: the Python torch.Generator of a device's default generator
  m.def("default_generator", [](int device) { return npusim::default_generator(device); });

  // ACL-like primitives for the operator layer
  m.attr("SINGLE_FOREACH_OP_TENSOR_COUNT") = npusim::kSingleForeachOpTensorCount;
  m.def("launch_foreach_copy",
      [](const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs, bool wait, double timeout_s) {
        return npusim::launch_foreach_copy(dsts, srcs, wait, timeout_s);
      },
      py::arg("dsts"), py::arg("srcs"), py::arg("wait") = false, py::arg("timeout_s") = -1.0, release());
  m.def("memcpy_batch", &npusim::memcpy_batch, py::arg("dsts"), py::arg("srcs"), py::arg("timeout_s") = -1.0,
      release());
  m.def("same_byte_layouts", &npusim::same_byte_layouts);
  m.def("dtype_mask", &npusim::dtype_mask);
  m.def("memcpy_batch_async", &npusim::memcpy_batch_async, release());
  m.def("can_use_fast_route", &npusim::can_use_fast_route);
  m.def("check_foreach_api_restrictions", &npusim::check_foreach_api_restrictions);

  // the native _foreach_copy_ kernel (See Note [Native _foreach_copy_ kernel])
  m.def("register_foreach_copy_kernel", &npusim::register_foreach_copy_kernel);
  m.def("set_foreach_copy_profile", &npusim::set_foreach_copy_profile);
  m.def("set_foreach_copy_legacy", &npusim::set_foreach_copy_legacy);
  m.def("set_foreach_copy_traced", &npusim::set_foreach_copy_traced);
  m.def("foreach_copy_mirror", [] {
    const npusim::ForeachCopyMirror m = npusim::foreach_copy_mirror();
    py::dict d;
    d["kernel"] = m.kernel;
    d["nd_out"] = m.nd_out;
    d["fast_dtypes"] = m.fast_dtypes;
    d["sync_timeout_s"] = m.sync_timeout_s;
    d["legacy"] = m.legacy;
    d["traced"] = m.traced;
    return d;
  });
  m.def("foreach_copy_counts", [] {
    const npusim::ForeachCopyCounts c = npusim::foreach_copy_counts();
    return py::make_tuple(c.native, c.routed);
  });
}

}  // namespace npusim
