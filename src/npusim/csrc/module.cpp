// Python bindings of the device core (npusim._C). Calls that can wait on a
// stream release the GIL: stream workers may need it to destroy tensors.
#include "core_api.h"
#include "device_hooks.h"
#include "memory.h"
#include "primitives.h"
#include "runtime.h"
#include "tensor_alias.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;
using npusim::NpuStream;

namespace {

py::tuple stream_tuple(const NpuStream& s) {
  return py::make_tuple(s.id(), static_cast<int>(s.device()), static_cast<int>(c10::DeviceType::PrivateUse1));
}

py::dict memory_stats_dict(const npusim::MemoryStats& s) {
  py::dict d;
  d["allocated_bytes"] = s.allocated.load();
  d["peak_allocated_bytes"] = s.peak_allocated.load();
  d["reserved_bytes"] = s.reserved.load();
  d["peak_reserved_bytes"] = s.peak_reserved.load();
  d["capacity_bytes"] = s.capacity.load();
  d["num_allocs"] = s.num_allocs.load();
  d["num_ooms"] = s.num_ooms.load();
  return d;
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
      [](NpuStream* s) { return s->query(); },
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
  m.def("core_api", [] {
    return py::capsule(static_cast<const void*>(&core_api_table()), npusim::kCoreApiCapsule);
  });

  // devices
  m.def("device_count", &npusim::device_count);
  m.def("set_device_count", &npusim::set_device_count);
  m.def("current_device", [] { return static_cast<int>(npusim::current_device()); });
  m.def("set_device", [](int i) { npusim::set_current_device(static_cast<c10::DeviceIndex>(i)); });
  m.def("set_launch_blocking", &npusim::set_launch_blocking);

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
  m.def("memory_stats", [](int device) { return memory_stats_dict(npusim::memory_stats(device)); });
  m.def("set_memory_capacity", [](int device, int64_t bytes) {
    npusim::memory_stats(device).capacity = bytes;
  });
  m.def("reset_peak_memory_stats", [](int device) { npusim::reset_peak_stats(device); });
  m.def("empty_cache", &npusim::empty_cache);

  // timing model
  m.def("set_timing_model", [](double copy_bytes_per_us, double launch_latency_us, double link_bytes_per_us) {
    auto& t = npusim::timing_model();
    t.copy_bytes_per_us = copy_bytes_per_us;
    t.launch_latency_us = launch_latency_us;
    t.link_bytes_per_us = link_bytes_per_us;
  });
  m.def("timing_model", [] {
    auto& t = npusim::timing_model();
    return py::make_tuple(t.copy_bytes_per_us.load(), t.launch_latency_us.load(), t.link_bytes_per_us.load());
  });

  // random numbers
  m.def("manual_seed", [](int device, uint64_t seed) {
    auto gen = npusim::device_generator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  });
  m.def("seed", [](int device) {
    auto gen = npusim::device_generator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.seed();
  });
  m.def("initial_seed", [](int device) { return npusim::device_generator(device).current_seed(); });
  m.def("get_rng_state", [](int device) {
    auto gen = npusim::device_generator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  });
  m.def("set_rng_state", [](int device, const at::Tensor& state) {
    auto gen = npusim::device_generator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  });

  // ACL-like primitives for the operator layer
  m.attr("SINGLE_FOREACH_OP_TENSOR_COUNT") = npusim::kSingleForeachOpTensorCount;
  m.def("launch_foreach_copy", &npusim::launch_foreach_copy);
  m.def("memcpy_batch", &npusim::memcpy_batch, release());
  m.def("memcpy_batch_async", &npusim::memcpy_batch_async, release());
  m.def("can_use_fast_route", &npusim::can_use_fast_route);
  m.def("check_foreach_api_restrictions", &npusim::check_foreach_api_restrictions);
  m.def("increment_version", &npusim::increment_version);
}
