// Bindings of the allocators: device memory, pinned host memory, snapshots.
#include "bindings.h"

#include "../runtime/device_allocator.h"
#include "../runtime/host_allocator.h"

namespace py = pybind11;

namespace {

py::list snapshot_list() {
  py::list segments;
  for (const auto& seg : npusim::memory_snapshot()) {
    py::dict block;
    block["address"] = seg.block.address;
    block["size"] = seg.block.size;
    block["requested_size"] = seg.block.requested_size;
    block["state"] = seg.block.state;
    block["frames"] = py::list();
    py::dict d;
    d["device"] = static_cast<int>(seg.device);
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.block.state == "active_allocated" ? seg.total_size : 0;
    d["active_size"] = seg.block.state == "inactive" ? 0 : seg.total_size;
    d["requested_size"] = seg.block.requested_size;
    d["stream"] = seg.stream;
    d["segment_type"] = seg.is_large ? "large" : "small";
    d["segment_pool_id"] = py::make_tuple(0, 0);
    d["is_expandable"] = false;
    d["adopted"] = seg.adopted;
    d["frames"] = py::list();
    d["blocks"] = py::make_tuple(block);
    segments.append(d);
  }
  return segments;
}

py::list trace_list(int device) {
  py::list out;
  for (const auto& e : npusim::memory_trace(static_cast<c10::DeviceIndex>(device))) {
    py::dict d;
    d["action"] = e.action;
    d["addr"] = e.address;
    d["size"] = e.size;
    d["stream"] = e.stream;
    d["time_us"] = e.time_us;
    d["frames"] = py::list();
    out.append(d);
  }
  return out;
}

}  // namespace

namespace npusim {

void init_memory_bindings(py::module& m) {
  using release = py::call_guard<py::gil_scoped_release>;

  // memory
  m.def("memory_capacity", [](int device) { return npusim::memory_capacity(device); });
  m.def("set_memory_capacity", [](int device, int64_t bytes) { npusim::set_memory_capacity(device, bytes); });
  m.def("memory_fraction", [](int device) { return npusim::memory_fraction(device); });
  m.def("set_memory_fraction", [](int device, double f) { npusim::set_memory_fraction(device, f); });
  m.def("reset_peak_memory_stats", [](int device) { npusim::reset_peak_stats(device); });
  m.def("reset_accumulated_memory_stats", [](int device) { npusim::reset_accumulated_stats(device); });
  m.def("empty_cache", [] {
    npusim::empty_cache();
    npusim::reclaim_pinned_frees();
  }, release());
  m.def("set_allocator_settings", [](int64_t max_split_size, double gc_threshold, int64_t divisions) {
    npusim::AllocatorSettings s;
    s.max_split_size = max_split_size < 0 ? SIZE_MAX : static_cast<size_t>(max_split_size);
    s.garbage_collection_threshold = gc_threshold;
    s.roundup_power2_divisions = static_cast<size_t>(std::max<int64_t>(0, divisions));
    npusim::set_allocator_settings(s);
  });
  m.def("allocator_settings", [] {
    const npusim::AllocatorSettings s = npusim::allocator_settings();
    py::dict d;
    d["max_split_size"] = s.max_split_size == SIZE_MAX ? py::object(py::none()) : py::int_(s.max_split_size);
    d["garbage_collection_threshold"] = s.garbage_collection_threshold;
    d["roundup_power2_divisions"] = s.roundup_power2_divisions;
    return d;
  });
  m.def("memory_snapshot", &snapshot_list);
  m.def("record_memory_history", [](bool enabled, int64_t max_entries) {
    npusim::record_memory_history(enabled, static_cast<size_t>(std::max<int64_t>(0, max_entries)));
  });
  m.def("memory_trace", &trace_list);
  m.def("host_memory_stats", [] {
    const auto& h = npusim::host_stats();
    py::dict d;
    d["allocated_bytes.current"] = h.allocated.load();
    d["allocated_bytes.peak"] = h.peak_allocated.load();
    d["num_host_alloc"] = h.num_allocs.load();
    d["num_host_free"] = h.num_frees.load();
    return d;
  });
}

}  // namespace npusim
