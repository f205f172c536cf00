// Python bindings of the npu collective backend (npusim_dist_C).
#include "backend.h"
#include "mirror_backend.h"
#include "core_api_client.h"
#include "../runtime/host_wait.h"

#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>

namespace py = pybind11;

namespace npusim::dist {
namespace {
std::atomic<const CoreApi*> g_core{nullptr};
}  // namespace

void set_core_api(const CoreApi* api) {
  g_core = api;
}

const CoreApi& core() {
  const CoreApi* api = g_core.load();
  TORCH_CHECK(api != nullptr, "npusim collective backend: the device core API was not set; "
      "import npusim.distributed instead of the extension");
  return *api;
}

}  // namespace npusim::dist

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_core_api", [](const py::capsule& capsule) {
    TORCH_CHECK(std::string(capsule.name()) == npusim::kCoreApiCapsule,
        "npusim collective backend: expected a capsule named ", npusim::kCoreApiCapsule,
        ", got ", capsule.name());
    const auto* api = capsule.get_pointer<const npusim::CoreApi>();
    TORCH_CHECK(api->version == npusim::kCoreApiVersion && api->size == sizeof(npusim::CoreApi),
        "npusim collective backend: built for core API version ", npusim::kCoreApiVersion, " (",
        sizeof(npusim::CoreApi), " bytes), but the loaded device core has version ", api->version,
        " (", api->size, " bytes); rebuild both (clear the npusim build cache)");
    npusim::dist::set_core_api(api);
    npusim::set_host_wait_interrupt(api->host_wait_interrupt);  // Note [Interruptible host waits]
  });
  using npusim::dist::MirrorBackend;
  using npusim::dist::NpuOptions;
  using npusim::dist::ProcessGroupNpu;
  // Registered so that Python sees the attributes split_group() reads.
  py::class_<NpuOptions, c10d::Backend::Options, c10::intrusive_ptr<NpuOptions>>(m, "Options")
      .def("__deepcopy__", [](const NpuOptions& self, const py::dict&) { return c10::make_intrusive<NpuOptions>(self); });
  py::class_<ProcessGroupNpu, c10d::Backend, c10::intrusive_ptr<ProcessGroupNpu>>(m, "ProcessGroupNpu")
      .def_property_readonly("options", &ProcessGroupNpu::getBackendOptions);
  m.def("drain_releases", &npusim::dist::CommStream::drain_releases, py::arg("timeout_s"),
      py::call_guard<py::gil_scoped_release>());
  m.def("wait_idle", &npusim::dist::CommStream::wait_idle, py::arg("timeout_s"),
      py::call_guard<py::gil_scoped_release>());
  m.def("create_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& gloo, int rank, int size, int64_t timeout_ms,
          const std::string& name, std::vector<int> global_ranks) -> c10::intrusive_ptr<ProcessGroupNpu> {
        return c10::make_intrusive<npusim::dist::ProcessGroupNpu>(
            gloo, rank, size, std::chrono::milliseconds(timeout_ms), name, std::move(global_ranks));
      },
      py::arg("gloo"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("name"),
      py::arg("global_ranks"));
  // A planned world's CPU group, in ProcessGroupGloo's place (plan/world.py): called as torch.distributed
  // calls ProcessGroupGloo(store, rank, size, timeout=...).
  py::class_<MirrorBackend, c10d::Backend, c10::intrusive_ptr<MirrorBackend>>(m, "PlannedGloo")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>&, int rank, int size, std::chrono::milliseconds timeout) {
        return c10::make_intrusive<MirrorBackend>(rank, size, timeout);
      }), py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout") = std::chrono::minutes(30))
      .def_property_readonly("options", &MirrorBackend::getBackendOptions);
  // A group of a planned world (Note [A planned world]): a MirrorBackend for the inner gloo group.
  m.def("create_planned_backend",
      [](int rank, int size, int64_t timeout_ms, const std::string& name,
          std::vector<int> global_ranks) -> c10::intrusive_ptr<ProcessGroupNpu> {
        return c10::make_intrusive<npusim::dist::ProcessGroupNpu>(c10::make_intrusive<npusim::dist::MirrorBackend>(
            rank, size), rank, size, std::chrono::milliseconds(timeout_ms), name, std::move(global_ranks));
      },
      py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("name"), py::arg("global_ranks"));
}
