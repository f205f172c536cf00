// Bindings of the aten floor: device registration, the fallback routes, the
// generator and the _foreach_copy_ kernel with its router.
#include "bindings.h"

#include "../aten/backend_meta.h"
#include "../aten/device_hooks.h"
#include "../aten/fallback.h"
#include "../aten/foreach_copy.h"
#include "../aten/generator.h"
#include "../aten/host_transfer.h"
#include "../aten/intraop_threads.h"
#include "../aten/ipc.h"
#include "../aten/iterator_kernels.h"
#include "../aten/launch/meta_cache.h"
#include "../aten/launch/op_launch.h"
#include "../aten/launch/op_task.h"
#include "../aten/box_muller.h"
#include "../aten/philox_blocks.h"
#include "../aten/primitives.h"

#include <torch/csrc/DynamicTypes.h>
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

  m.def("invalidate_compute_costs", &npusim::invalidate_compute_costs);

  // random numbers: the Python torch.Generator of a device's default generator
  m.def("default_generator", [](int device) { return npusim::default_generator(device); });
  // Note [Philox blocks in batches]: the words of n blocks drawn by one form
  // ("auto", "portable", "avx2", "avx512"), as an int64 tensor [n, 4] of
  // 32-bit words; None for a form this machine lacks.
  m.def("philox_words", [](const std::string& form, uint64_t seed, uint64_t offset, int64_t n) -> py::object {
    TORCH_CHECK(n >= 0, "philox_words: expected n >= 0, got ", n);
    std::vector<uint32_t> words(static_cast<size_t>(4 * n));
    if (!npusim::philox_words_by_form(form.c_str(), seed, offset, n, words.data())) {
      return py::none();
    }
    at::Tensor out = at::empty({n, 4}, at::kLong);
    int64_t* data = out.data_ptr<int64_t>();
    for (size_t i = 0; i < words.size(); ++i) {
      data[i] = words[i];
    }
    return py::cast(out);
  });

  // Note [Box-Muller bit for bit]: over every input, how many log1pf and cosf
  // results of a form differ from a reference's; None for one this machine lacks.
  m.def("box_muller_mismatches", [](const std::string& form, const std::string& reference) -> py::object {
    int64_t log1p_mismatches = 0;
    int64_t cos_mismatches = 0;
    if (!npusim::box_muller_mismatches(form.c_str(), reference.c_str(), log1p_mismatches, cos_mismatches)) {
      return py::none();
    }
    return py::make_tuple(log1p_mismatches, cos_mismatches);
  });

  m.def("cached_meta_plans", &npusim::cached_meta_plans);
  m.def("usable_cores", &npusim::usable_cores);
  m.def("worker_intraop_threads", &npusim::worker_intraop_threads, py::arg("user"), py::arg("elements"),
      py::arg("pointwise"));

  // torch.npu._sleep: a task that only holds the current stream (the host does not wait)
  m.def("launch_delay", &npusim::launch_delay, py::arg("device"), py::arg("duration_us"),
      py::call_guard<py::gil_scoped_release>());

  m.attr("SINGLE_FOREACH_OP_TENSOR_COUNT") = npusim::kSingleForeachOpTensorCount;

  // the _foreach_copy_ kernel and its router (See Note [The _foreach_copy_ router])
  m.def("register_foreach_copy_kernel", &npusim::register_foreach_copy_kernel);
  m.def("set_foreach_copy_config",
      [](bool kernel, bool nd_out, bool batch, bool memcpy_batch, bool memcpy_batch_async,
          const std::vector<at::ScalarType>& fast_dtypes, double sync_timeout_s) {
        npusim::set_foreach_copy_config({kernel, nd_out, batch, memcpy_batch, memcpy_batch_async,
            npusim::dtype_mask(fast_dtypes), sync_timeout_s});
      },
      py::arg("kernel"), py::arg("nd_out"), py::arg("batch"), py::arg("memcpy_batch"),
      py::arg("memcpy_batch_async"), py::arg("fast_dtypes"), py::arg("sync_timeout_s"));
  m.def("foreach_copy_config", [] {
    const npusim::ForeachCopyConfig c = npusim::foreach_copy_config();
    py::dict d;
    d["kernel"] = c.kernel;
    d["nd_out"] = c.nd_out;
    d["batch"] = c.batch;
    d["memcpy_batch"] = c.memcpy_batch;
    d["memcpy_batch_async"] = c.memcpy_batch_async;
    py::list dtypes;
    for (int t = 0; t < static_cast<int>(c10::ScalarType::NumOptions); ++t) {
      if ((c.fast_dtypes >> t) & 1) {
        dtypes.append(py::reinterpret_borrow<py::object>(
            reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(t)))));
      }
    }
    d["fast_dtypes"] = dtypes;
    d["sync_timeout_s"] = c.sync_timeout_s;
    return d;
  });
  m.def("set_foreach_copy_legacy", &npusim::set_foreach_copy_legacy);
  m.def("foreach_copy_legacy", &npusim::foreach_copy_legacy);
  m.def("set_original_batch_eligibility", &npusim::set_original_batch_eligibility);
  // sink(groups, non_blocking, legacy), groups a list of (route, pairs, chunks, non_blocking, dtype or None);
  // None removes it.
  m.def("set_foreach_copy_trace_sink", [](py::object sink) {
    if (sink.is_none()) {
      npusim::set_foreach_copy_trace_sink(nullptr);
      return;
    }
    // The kernel may drop the last reference on a thread without the GIL.
    auto fn = std::shared_ptr<py::object>(new py::object(std::move(sink)), [](py::object* f) {
      const py::gil_scoped_acquire gil;
      delete f;
    });
    npusim::set_foreach_copy_trace_sink([fn](const npusim::ForeachCopyCall& call) {
      const py::gil_scoped_acquire gil;
      py::list groups;
      for (const npusim::ForeachCopyGroup& g : call.groups) {
        py::object dtype = py::none();
        if (g.dtype.has_value()) {
          dtype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(*g.dtype)));
        }
        groups.append(py::make_tuple(npusim::route_name(g.route), g.pairs, g.chunks, g.non_blocking, dtype));
      }
      (*fn)(groups, call.non_blocking, call.legacy);
    });
  });
  m.def("foreach_copy_traced", &npusim::foreach_copy_traced);
  m.def("iterator_kernel_runs", &npusim::iterator_kernel_runs);
  m.def("foreach_results_in_place_runs", &npusim::foreach_results_in_place_runs);
  m.def("results_copied_into_place", &npusim::results_copied_into_place);
  m.def("set_small_ops_on_the_host", &npusim::set_small_ops_on_the_host);
  m.def("foreach_copy_route_counts", [] {
    const std::vector<int64_t> counts = npusim::foreach_copy_route_counts();
    py::dict d;
    for (size_t r = 0; r < counts.size(); ++r) {
      d[npusim::route_name(static_cast<npusim::ForeachCopyRoute>(r))] = counts[r];
    }
    return d;
  });

  // backend metadata of npu tensors (Note [npu backend metadata]): npusim.runtime.backend_meta
  m.def("get_backend_meta", &npusim::get_backend_meta);
  m.def("set_backend_meta", &npusim::set_backend_meta);

  // npu tensors shared between processes (Note [Sharing npu tensors between processes]): npusim.runtime.ipc.
  // Sharing synchronizes the device: the GIL is released.
  m.def("share_npu_storage", &npusim::share_npu_storage, py::call_guard<py::gil_scoped_release>());
  m.def("open_shared_npu_storage", &npusim::open_shared_npu_storage);
}

}  // namespace npusim
