// Python bindings of the device core (npusim._C). Calls that can wait on a
// stream release the GIL: stream workers may need it to destroy tensors.
#include "core_api.h"
#include "device_hooks.h"
#include "fallback.h"
#include "foreach_copy.h"
#include "generator.h"
#include "graph.h"
#include "memory.h"
#include "primitives.h"
#include "runtime.h"
#include "host_transfer.h"

#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;
using npusim::NpuStream;

namespace {

py::tuple stream_tuple(const NpuStream& s) {
  return py::make_tuple(s.id(), static_cast<int>(s.device()), static_cast<int>(c10::DeviceType::PrivateUse1));
}

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

// The sanitizer's stream-op observer: a Python callable, called with the GIL
// on the host thread that recorded, waited or synchronized. Leaked so that
// no destructor runs it at interpreter exit.
py::object*& stream_op_observer() {
  static py::object* observer = nullptr;
  return observer;
}

void call_stream_op_observer(int op, uintptr_t event, int device, int64_t stream) {
  if (npusim::on_stream_worker() || !Py_IsInitialized()) {
    return;
  }
  py::gil_scoped_acquire gil;
  py::object* observer = stream_op_observer();
  if (observer == nullptr) {
    return;
  }
  try {
    (*observer)(op, event, device, stream);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("npusim stream-op observer");  // an observer never breaks the program
  }
}

// The sanitizer's memory observer, called with (ptr, delta, device). A free
// on a thread that holds the GIL (the host dropping a tensor) is handed over
// at once, so the report can show where it happened; others are logged for
// the observer to take (take_memory_events).
py::object*& memory_observer() {
  static py::object* observer = nullptr;
  return observer;
}

void call_memory_observer(const npusim::MemoryEvent& event) {
  if (!Py_IsInitialized() || !PyGILState_Check()) {
    npusim::log_memory_event(event);
    return;
  }
  py::object* observer = memory_observer();
  if (observer == nullptr) {
    return;
  }
  // Keep a pending Python error (a free during exception unwinding) intact.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  try {
    (*observer)(event.ptr, event.delta, event.device);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("npusim memory observer");
  }
  PyErr_Restore(type, value, traceback);
}

// The table behind core_api(); see core_api.h for why it exists.
const npusim::CoreApi& core_api_table() {
  static const npusim::CoreApi table{
      npusim::kCoreApiVersion,
      sizeof(npusim::CoreApi),
      &npusim::current_device,
      [](c10::DeviceIndex device) { return &npusim::current_stream(device); },
      [](NpuStream* s, std::function<void()> fn, double us) { s->enqueue(std::move(fn), us, "collective"); },
      [](NpuStream* s) {
        // Only the collective backend uses this table, and it asks before it
        // issues anything: the place to refuse a collective during capture.
        TORCH_CHECK(s->capture() == nullptr, "npu graph capture: collectives cannot be captured (",
            s->name(), " is capturing); run them outside the captured region");
        return s->query();
      },
      &npusim::cpu_alias,
      &npusim::link_task_us,
      &npusim::new_fence_counter,
      &npusim::maybe_reclaim_deferred_frees,
  };
  return table;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using release = py::call_guard<py::gil_scoped_release>;

  m.def("register_device", &npusim::register_device);
  m.def("route_structured_ops_to_fallback", &npusim::route_structured_ops_to_fallback);
  m.def("core_api", [] {
    return py::capsule(static_cast<const void*>(&core_api_table()), npusim::kCoreApiCapsule);
  });

  // devices
  m.def("device_count", &npusim::device_count);
  m.def("set_device_count", &npusim::set_device_count);
  m.def("current_device", [] { return static_cast<int>(npusim::current_device()); });
  m.def("set_device", [](int i) { npusim::set_current_device(static_cast<c10::DeviceIndex>(i)); });
  m.def("set_launch_blocking", &npusim::set_launch_blocking);
  m.def("in_bad_fork", &npusim::in_bad_fork);

  // streams
  m.def("current_stream", [](int device) { return stream_tuple(npusim::current_stream(device)); });
  m.def("default_stream", [](int device) {
    npusim::check_device_index(device, "default_stream");
    return stream_tuple(npusim::default_stream(device));
  });
  m.def("set_stream", [](int64_t id, int device) {
    // As torch.cuda.set_stream: the stream's device becomes current too.
    const NpuStream& s = npusim::stream_for(device, id);
    npusim::set_current_device(s.device());
    npusim::exchange_current_stream(s.unwrap());
  });
  m.def("stream_priority", [](int64_t id, int device) {
    return npusim::stream_for(device, id).priority();
  });
  m.def("stream_enqueued", [](int64_t id, int device) {
    return npusim::stream_for(device, id).enqueued();
  });
  m.def("stream_pending", [](int64_t id, int device) {
    const NpuStream& s = npusim::stream_for(device, id);
    return s.enqueued() - s.completed();
  });
  m.def("synchronize_stream",
      [](int64_t id, int device, double timeout_s) {
        npusim::stream_for(device, id).synchronize(timeout_s);
        npusim::trace_stream_op(npusim::StreamOp::kSyncStream, nullptr, device, id);
      },
      py::arg("stream_id"), py::arg("device"), py::arg("timeout_s") = -1.0, release());
  m.def("synchronize_device", [](int device) {
    npusim::check_device_index(device, "synchronize");
    npusim::synchronize_device(device);
    npusim::trace_stream_op(npusim::StreamOp::kSyncDevice, nullptr, device, -1);
  }, release());
  m.def("synchronize_all", [] {
    npusim::synchronize_all();
    npusim::trace_stream_op(npusim::StreamOp::kSyncAll, nullptr, -1, -1);
  }, release());

  // observers (torch.profiler needs no binding; see trace.h)
  m.def("set_stream_op_observer", [](py::object fn) {
    npusim::set_stream_op_hook(nullptr);
    py::object*& observer = stream_op_observer();
    // The old observer is leaked, not destroyed: another thread may be calling it.
    observer = fn.is_none() ? nullptr : new py::object(std::move(fn));
    if (observer != nullptr) {
      npusim::set_stream_op_hook(&call_stream_op_observer);
    }
  });
  m.def("set_memory_observer", [](py::object fn) {
    npusim::set_memory_hook(nullptr);
    py::object*& observer = memory_observer();
    observer = fn.is_none() ? nullptr : new py::object(std::move(fn));  // the old one is leaked, see above
    if (observer != nullptr) {
      npusim::set_memory_hook(&call_memory_observer);
    }
  });
  m.def("take_memory_events", [] {
    py::list out;
    for (const auto& e : npusim::take_memory_events()) {
      out.append(py::make_tuple(e.ptr, e.delta, e.device));
    }
    return out;
  });

  // memory
  m.def("memory_capacity", [](int device) { return npusim::memory_capacity(device); });
  m.def("set_memory_capacity", [](int device, int64_t bytes) { npusim::set_memory_capacity(device, bytes); });
  m.def("memory_fraction", [](int device) { return npusim::memory_fraction(device); });
  m.def("set_memory_fraction", [](int device, double f) { npusim::set_memory_fraction(device, f); });
  m.def("reset_peak_memory_stats", [](int device) { npusim::reset_peak_stats(device); });
  m.def("reset_accumulated_memory_stats", [](int device) { npusim::reset_accumulated_stats(device); });
  m.def("empty_cache", &npusim::empty_cache, release());
  m.def("set_allocator_settings", [](int64_t max_split_size, double gc_threshold, int64_t divisions) {
    npusim::AllocatorSettings s;
    s.max_split_size = max_split_size < 0 ? SIZE_MAX : static_cast<size_t>(max_split_size);
    s.garbage_collection_threshold = gc_threshold;
    s.roundup_power2_divisions = static_cast<size_t>(std::max<int64_t>(0, divisions));
    npusim::set_allocator_settings(s);
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

  // timing model
  m.def("set_timing_model", [](double copy_gbps, double launch_us, double link_gbps) {
    auto& t = npusim::timing_model();
    t.copy_gbps = copy_gbps;
    t.launch_us = launch_us;
    t.link_gbps = link_gbps;
  });
  m.def("timing_model", [] {
    auto& t = npusim::timing_model();
    return py::make_tuple(t.copy_gbps.load(), t.launch_us.load(), t.link_gbps.load());
  });

  // random numbers: the Python torch.Generator of a device's default generator
  m.def("default_generator", [](int device) { return npusim::default_generator(device); });

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
  m.def("launch_delay", &npusim::launch_delay, py::arg("device"), py::arg("duration_us"), release());
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
