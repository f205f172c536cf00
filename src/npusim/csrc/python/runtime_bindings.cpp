// Bindings of the runtime floor: devices, streams, the timing model, and the
// core_api table other extensions link against (runtime/core_api.h).
#include "bindings.h"

#include "../runtime/core_api.h"
#include "../runtime/device.h"
#include "../runtime/device_allocator.h"
#include "../runtime/host_allocator.h"
#include "../runtime/host_wait.h"
#include "../runtime/plan_mode.h"
#include "../runtime/stream.h"
#include "../runtime/subnormals.h"
#include "../runtime/timing.h"
#include "../runtime/trace.h"
#include "../aten/compiled_kernel.h"
#include "../aten/host_transfer.h"

#include <torch/csrc/autograd/python_variable.h>

#include <optional>

namespace py = pybind11;

namespace {

using npusim::NpuStream;

py::tuple stream_tuple(const NpuStream& s) {
  return py::make_tuple(s.id(), static_cast<int>(s.device()), static_cast<int>(c10::DeviceType::PrivateUse1));
}

// The interrupt check of host waits (Note [Interruptible host waits]): on a
// thread that runs Python, Python's pending signal handlers; a handler that
// raised ends the wait with its error.
void check_python_signals() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (!Py_IsInitialized() || finalizing || PyGILState_GetThisThreadState() == nullptr) {
    return;
  }
  const py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) {
    throw py::error_already_set();
  }
}

// Asked of a thread that uses the npu after exit began (Note [Launches at
// exit]): a thread that runs Python gives the GIL up for good, so that
// finalization can take it, and is stopped; the core's own threads are not.
bool release_the_gil_for_good() {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) {
    return false;
  }
  if (PyGILState_Check() != 0) {
    PyEval_SaveThread();
  }
  return true;
}

// Note [Daemon threads at finalization]
// Python 3.11 ends a daemon thread that takes the GIL while the interpreter
// finalizes with pthread_exit, and glibc unwinds its stack. When that happens
// inside a C++ frame that gave the GIL up (the gil_scoped_release of every
// torch op's binding: its destructor takes the GIL back, and a destructor is
// noexcept), the unwinding reaches std::terminate and the process aborts,
// exit status 134, "terminate called without an active exception": a daemon
// thread doing torch work at exit aborted 8 runs of 8 with CPU torch 2.13
// alone. npusim's exit stops the Python threads that reach its launches and
// waits (Note [Launches at exit]), but a thread inside a CPU kernel or a meta
// function when finalization begins still dies that way. So npusim installs
// a terminate handler that, for that case alone (the interpreter finalizing,
// a thread that runs Python), lets the thread sleep instead of aborting the
// process: the thread was being ended anyway, and the process's exit ends
// it; in every other case the previous handler runs, as before.
std::terminate_handler g_previous_terminate = nullptr;

[[noreturn]] void terminate_unless_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (finalizing && PyGILState_GetThisThreadState() != nullptr) {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
  }
  if (g_previous_terminate != nullptr) {
    g_previous_terminate();
  }
  std::abort();
}

// The timing model's collective cost, npusim.runtime.timing's hook:
// fn(op, bytes, global ranks) -> microseconds (None: the link bandwidth alone).
py::object& collective_cost_function() {
  static auto& fn = *new py::object();  // leaked: comm threads may outlive the interpreter's teardown
  return fn;
}

double collective_us(const std::string& op, size_t bytes, const std::vector<int>& ranks) {
  {
    const py::gil_scoped_acquire gil;
    const py::object& fn = collective_cost_function();
    if (fn && !fn.is_none()) {
      return fn(op, bytes, ranks).cast<double>();
    }
  }
  return bytes > 0 ? npusim::link_task_us(bytes) : 0.0;
}

// The table behind core_api(); see core_api.h for why it exists.
const npusim::CoreApi& core_api_table() {
  static const npusim::CoreApi table{
      npusim::kCoreApiVersion,
      sizeof(npusim::CoreApi),
      &npusim::current_device,
      [](c10::DeviceIndex device) { return &npusim::current_stream(device); },
      [](NpuStream* s, std::function<void()> fn, const char* op, bool wait) {
        // A signal (Note [Errors of asynchronous work]): a comm stream waits for it.
        s->enqueue(std::move(fn), 0.0, op, wait ? npusim::TaskKind::kWait : npusim::TaskKind::kSignal);
      },
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
      [] {
        npusim::maybe_reclaim_deferred_frees();
        npusim::reclaim_pinned_frees();
      },
      &check_python_signals,
      [](std::string name, c10::DeviceIndex device, double modelled_us) {
        return npusim::profile_task(std::move(name), device, npusim::kCommLane, npusim::ActivityKind::kKernel,
            modelled_us);
      },
      &npusim::run_profiled,
      &npusim::chip_clock_on,
      &npusim::realtime_timing,
      &npusim::host_launch,
      &npusim::host_wait_until,
      &npusim::host_query,
      &npusim::host_clock_us,
      &npusim::task_wait_until,
      &npusim::task_or_host_now,
      &npusim::note_task_span,
      &collective_us,
      &npusim::work_runs,
  };
  return table;
}

// A Python call a stream task makes (a compiled kernel recorded into an npu
// graph): it takes the GIL to run, and to be destroyed, since the task and the
// graph holding it may go away on a stream worker.
struct PythonCall {
  py::object fn;
  py::tuple args;

  void run() const {
    const py::gil_scoped_acquire gil;
    try {
      fn(*args);
    } catch (py::error_already_set& e) {
      throw std::runtime_error(e.what());  // the message, without Python state outside the GIL
    }
  }
};

std::shared_ptr<PythonCall> python_call(py::object fn, py::tuple args) {
  return std::shared_ptr<PythonCall>(new PythonCall{std::move(fn), std::move(args)}, [](PythonCall* call) {
#if PY_VERSION_HEX >= 0x030D0000
    const bool finalizing = Py_IsFinalizing();
#else
    const bool finalizing = _Py_IsFinalizing();
#endif
    if (Py_IsInitialized() && !finalizing) {
      const py::gil_scoped_acquire gil;
      delete call;
    }  // else leaked: the interpreter is going away
  });
}

// The direct call of a compiled kernel's entry point on `args` (Note
// [Compiled kernels without the GIL]), with what it reads and writes in
// `access` (null: not asked, the stream is not captured); nullopt where the
// kernel keeps its Python call. `signature`: a letter per argument, 'r' a
// tensor the kernel reads, 'w' one it writes, 'i' a 64-bit integer.
std::optional<npusim::CompiledKernelCall> direct_kernel_call(uintptr_t entry, const py::tuple& args,
    const std::string& signature, c10::DeviceIndex device, npusim::TaskAccess* access) {
  if (entry == 0 || !npusim::compiled_kernels_callable() || signature.size() != args.size() ||
      args.size() > npusim::kMaxCompiledKernelArgs) {
    return std::nullopt;
  }
  npusim::CompiledKernelCall call;
  call.entry = reinterpret_cast<void*>(entry);
  for (size_t i = 0; i < args.size(); ++i) {
    PyObject* arg = PyTuple_GET_ITEM(args.ptr(), static_cast<Py_ssize_t>(i));
    const char kind = signature[i];
    if (kind == 'r' || kind == 'w') {
      if (!THPVariable_Check(arg)) {
        return std::nullopt;
      }
      const at::Tensor& t = THPVariable_Unpack(arg);
      if (!t.defined() || t.device().type() != npusim::kNpu || t.device().index() != device) {
        return std::nullopt;
      }
      call.words.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()));
      if (access != nullptr) {
        const c10::Storage& storage = t.storage();
        access->add(storage.data(), storage.nbytes(), kind == 'w');
      }
    } else if (kind == 'i' && PyLong_Check(arg)) {
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(arg, &overflow);
      if (overflow != 0 || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return std::nullopt;
      }
      call.words.push_back(static_cast<uint64_t>(value));
    } else {
      return std::nullopt;
    }
  }
  return call;
}

}  // namespace

namespace npusim {

void init_runtime_bindings(py::module& m) {
  using release = py::call_guard<py::gil_scoped_release>;

  set_host_wait_interrupt(&check_python_signals);  // Note [Interruptible host waits]
  npusim::set_thread_stop_hook(&release_the_gil_for_good);  // Note [Launches at exit]
  g_previous_terminate = std::set_terminate(&terminate_unless_finalizing);  // Note [Daemon threads at finalization]

  m.def("core_api", [] {
    return py::capsule(static_cast<const void*>(&core_api_table()), npusim::kCoreApiCapsule);
  });

  // the node's sizes, defined once (runtime/npu_type.h)
  m.attr("DEFAULT_DEVICE_COUNT") = npusim::kDefaultDeviceCount;
  m.attr("MAX_DEVICES") = npusim::kMaxDevices;
  m.attr("STREAMS_PER_DEVICE") = npusim::kStreamsPerDevice;

  // devices
  m.def("device_count", &npusim::device_count);
  m.def("set_device_count", &npusim::set_device_count);
  m.def("current_device", [] { return static_cast<int>(npusim::current_device()); });
  m.def("set_device", [](int i) { npusim::set_current_device(static_cast<c10::DeviceIndex>(i)); });
  m.def("set_launch_blocking", &npusim::set_launch_blocking);
  m.def("set_max_pending_launches", &npusim::set_max_pending_launches);
  m.def("max_pending_launches", &npusim::max_pending_launches);
  // Note [Sticky device errors]
  m.def("device_failure", [](int device) {
    npusim::check_device_index(device, "device_failure");
    return npusim::device_failure(static_cast<c10::DeviceIndex>(device));
  });
  m.def("clear_device_failure", [](int device) {
    npusim::clear_device_failure(static_cast<c10::DeviceIndex>(device));
  });
  // Note [Launches at exit]
  m.def("begin_exit", &npusim::begin_exit);
  m.def("drain_streams", &npusim::drain_streams, py::arg("timeout_s") = -1.0, release());
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
  m.def("stream_items_helped", [](int64_t id, int device) {
    return npusim::stream_for(device, id).items_helped();
  });
  m.def("synchronize_stream",
      [](int64_t id, int device, double timeout_s) {
        NpuStream& s = npusim::stream_for(device, id);
        npusim::refuse_unsafe_call_during_capture("Stream.synchronize", &s);  // Note [Capture-time refusals]
        s.synchronize(timeout_s);
        npusim::trace_stream_op(npusim::StreamOp::kSyncStream, nullptr, device, id);
      },
      py::arg("stream_id"), py::arg("device"), py::arg("timeout_s") = -1.0, release());
  m.def("synchronize_device", [](int device) {
    npusim::check_device_index(device, "synchronize");
    npusim::refuse_unsafe_call_during_capture("synchronize", nullptr, device);
    npusim::synchronize_device(device);
    npusim::trace_stream_op(npusim::StreamOp::kSyncDevice, nullptr, device, -1);
  }, release());
  m.def("synchronize_all", [] {
    npusim::refuse_unsafe_call_during_capture("synchronize", nullptr, npusim::kAllDevices);
    npusim::synchronize_all();
    npusim::trace_stream_op(npusim::StreamOp::kSyncAll, nullptr, -1, -1);
  }, release());

  // A compiled region's C++ kernel (compile/generated_calls.py): a stream task
  // that calls its C entry point `entry` when `signature` allows (Note
  // [Compiled kernels without the GIL]); else run now, after the current
  // stream's earlier work, or, while that stream is captured, recorded as a
  // task that calls it through Python when the graph is replayed (Note
  // [Compiled code in an npu graph]).
  m.def("launch_host_kernel", [](int device, py::object fn, py::tuple args, uintptr_t entry,
                                 const std::string& signature) {
    if (!npusim::device_computes()) {
      size_t bytes = 0;  // the npu tensors it is given, inputs and outputs
      for (const py::handle arg : args) {
        if (THPVariable_Check(arg.ptr())) {
          const at::Tensor& t = THPVariable_Unpack(arg.ptr());
          bytes += t.device().type() == npusim::kNpu ? t.numel() * t.element_size() : 0;
        }
      }
      if (!npusim::work_runs(bytes)) {
        return;  // Note [Plan mode]: large work writes nothing
      }
    }
    NpuStream& s = npusim::current_stream(static_cast<c10::DeviceIndex>(device));
    npusim::TaskAccess access;
    npusim::TaskAccess* const recorded = s.capture() != nullptr ? &access : nullptr;  // a capture's only
    if (auto call = direct_kernel_call(entry, args, signature, static_cast<c10::DeviceIndex>(device), recorded)) {
      s.enqueue(std::move(*call), 0.0, "compiled_kernel", npusim::TaskKind::kWork, recorded);
      return;
    }
    if (s.capture() != nullptr) {
      auto call = python_call(std::move(fn), std::move(args));
      s.enqueue([call] { call->run(); }, 0.0, "compiled_kernel");
      return;
    }
    {
      const py::gil_scoped_release release;  // stream workers may need the GIL to finish
      s.synchronize();
    }
    const npusim::KeepSubnormals keep_subnormals;  // a device kernel: Note [Subnormals on npu]
    fn(*args);
  }, py::arg("device"), py::arg("fn"), py::arg("args"), py::arg("entry") = 0, py::arg("signature") = "");

  // plan mode (Note [Plan mode])
  m.def("set_plan_mode", &npusim::set_plan_mode);
  m.def("device_computes", &npusim::device_computes);

  // timing model
  m.def("set_timing_model", [](double copy_gbps, double launch_us, double link_gbps) {
    auto& t = npusim::timing_model();
    t.copy_gbps = copy_gbps;
    t.launch_us = launch_us;
    t.link_gbps = link_gbps;
  });
  // the chip clock (Note [Chip clock])
  m.def("set_chip_clock", [](bool on, bool realtime, double host_launch_us, double host_cpu_factor) {
    npusim::set_chip_clock(npusim::ChipClockSettings{on, realtime, host_launch_us, host_cpu_factor});
  }, py::arg("on"), py::arg("realtime"), py::arg("host_launch_us"), py::arg("host_cpu_factor"));
  m.def("chip_clock", [] {
    const auto s = npusim::chip_clock_settings();
    return py::make_tuple(s.on, s.realtime, s.host_launch_us, s.host_cpu_factor);
  });
  m.def("set_collective_cost", [](py::object fn) { collective_cost_function() = std::move(fn); });
  m.def("host_clock_us", &npusim::host_clock_us);
  m.def("stream_clock_us", [](int64_t stream_id, int device) {
    return npusim::stream_for(static_cast<c10::DeviceIndex>(device), stream_id).clock_us();
  }, py::arg("stream_id"), py::arg("device"));
  m.def("host_clock_samples", &npusim::host_clock_samples);
  m.def("profiler_axis_anchor", &npusim::profiler_axis_anchor);
  m.def("timing_model", [] {
    auto& t = npusim::timing_model();
    return py::make_tuple(t.copy_gbps.load(), t.launch_us.load(), t.link_gbps.load());
  });
}

}  // namespace npusim
