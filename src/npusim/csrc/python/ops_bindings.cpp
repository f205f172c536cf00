// Bindings of the aten floor: device registration, the fallback routes, the
// generator, the ACL-like primitives and the native _foreach_copy_ kernel.
#include "bindings.h"

#include "../aten/device_hooks.h"
#include "../aten/fallback.h"
#include "../aten/foreach_copy.h"
#include "../aten/generator.h"
#include "../aten/host_transfer.h"
#include "../aten/primitives.h"

namespace py = pybind11;

namespace npusim {

void init_ops_bindings(py::module& m) {
  using release = py::call_guard<py::gil_scoped_release>;

  m.def("register_device", &npusim::register_device);
  m.def("route_structured_ops_to_fallback", &npusim::route_structured_ops_to_fallback);

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
