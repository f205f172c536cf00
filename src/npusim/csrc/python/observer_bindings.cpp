// Bindings of the observers (npusim.sanitizer; torch.profiler needs none, see
// runtime/trace.h).
#include "bindings.h"

#include "../runtime/cpu_allocator.h"
#include "../runtime/device.h"
#include "../runtime/trace.h"

namespace py = pybind11;

namespace {

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
    // The observer may make CPU tensors of its own, which must not come from
    // device memory even inside a CPU kernel (Note [CPU kernels allocate device memory]).
    const npusim::CpuAllocationsOnDevice host(-1);
    (*observer)(event.ptr, event.delta, event.device);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("npusim memory observer");
  }
  PyErr_Restore(type, value, traceback);
}

}  // namespace

namespace npusim {

void init_observer_bindings(py::module& m) {
  using release = py::call_guard<py::gil_scoped_release>;

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
}

}  // namespace npusim
