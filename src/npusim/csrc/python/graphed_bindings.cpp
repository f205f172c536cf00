// A make_graphed_callables step's forward and autograd node, without
// autograd.Function's per-call Python (runtime/graphs.py's caller).
#include "bindings.h"

#include "../graph/graph.h"

#include <ATen/record_function.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace npusim {
namespace {

namespace autograd = torch::autograd;

// Note [A graphed step without autograd.Function]
// A callable of make_graphed_callables copies its new inputs into the graph's
// static inputs, replays the forward graph and ties the static outputs to the
// inputs with one autograd node, whose backward replays the backward graph.
// torch.cuda builds that node with a Python autograd.Function. On npu, with
// the MLP of `bench graph-replay`, Function.apply cost the calling thread
// 7.7 us a call (4.9 us of it the C++ apply, which takes 0.3 us per input
// tensor, and a module's parameters are inputs; the rest its Python layer's
// functorch checks), and the copy and the replay another 2.4 us of Python:
// the step's forward call took 21 us of a graphed step's 54 us of host CPU.
// GraphedStep does the copies, the replay and the node in one call (the
// forward call then took 11 us). What the backward does stays in Python: the
// node calls the callable's backward function (gradients in, one gradient or
// None per input out) under the GIL on autograd's device thread, as
// autograd.Function's node does. It keeps autograd.Function's contract, so the
// Python side stays the only place that decides what a step copies and
// replays:
// - outputs: each a new alias (detach) of a static output; a differentiable
//   one gets the node as grad_fn where grad mode is on and an input requires
//   grad, and a non-differentiable one (an integer tensor) is an undefined
//   input of the node, as Function's _wrap_outputs makes them;
// - gradients: an output that received none arrives as None (autograd.Function
//   would have materialized zeros: the backward function zeroes the static
//   gradient instead, so a stale one is never replayed);
// - once_differentiable: the backward function runs with grad mode off, and
//   under create_graph its results are aliases through a DelayedError, whose
//   backward raises @once_differentiable's error;
// - forward-mode AD has no jvp here, as the Function defined none: an input
//   with a tangent is refused before anything is copied (autograd.Function
//   raised NotImplementedError).
// The node holds the step through a shared_ptr, so freeing a node on any
// thread takes no GIL; the step's own Python objects are released under it.

class GraphedStep : public std::enable_shared_from_this<GraphedStep> {
 public:
  GraphedStep(py::object forward_graph, std::vector<at::Tensor> static_inputs, std::vector<at::Tensor> params,
      std::vector<at::Tensor> static_outputs, py::object backward)
      : forward_graph_object_(std::move(forward_graph)),
        forward_graph_(&py::cast<NpuGraph&>(forward_graph_object_)),
        static_inputs_(std::move(static_inputs)),
        params_(std::move(params)),
        static_outputs_(std::move(static_outputs)),
        backward_(std::move(backward)) {}

  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  ~GraphedStep() {
    // The last node may go on a thread without the GIL; leak rather than touch a finished interpreter.
    if (Py_IsInitialized() == 0) {
      forward_graph_object_.release();
      backward_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    forward_graph_object_ = py::object();
    backward_ = py::object();
  }

  // The step's forward: copies, replay and outputs (called with the GIL held).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& user_inputs);

  // The backward function's gradients for `grads` (the node's, on autograd's thread).
  autograd::variable_list backward(const autograd::variable_list& grads) const;

  size_t num_inputs() const { return static_inputs_.size() + params_.size(); }

 private:
  py::object forward_graph_object_;  // keeps forward_graph_ alive
  NpuGraph* forward_graph_;
  std::vector<at::Tensor> static_inputs_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> static_outputs_;
  py::object backward_;
};

class GraphedBackward final : public autograd::Node {
 public:
  explicit GraphedBackward(std::shared_ptr<const GraphedStep> step) : step_(std::move(step)) {}

  std::string name() const override { return "GraphedBackward"; }

  autograd::variable_list apply(autograd::variable_list&& grads) override {
    const bool create_graph = at::GradMode::is_enabled();
    autograd::variable_list result;
    {
      at::AutoGradMode no_grad(false);  // @once_differentiable's backward runs without grad mode
      result = step_->backward(grads);
    }
    if (!create_graph || !autograd::any_variable_requires_grad(grads)) {
      return result;
    }
    // As @once_differentiable: aliases that require grad, through a DelayedError whose backward raises.
    for (at::Tensor& g : result) {
      if (g.defined()) {
        g = g.detach();
        g.set_requires_grad(true);
      }
    }
    autograd::DelayedError error(
        "trying to differentiate twice a function that was marked with @once_differentiable",
        static_cast<int64_t>(result.size()));
    return error.apply(std::move(result));
  }

 private:
  std::shared_ptr<const GraphedStep> step_;
};

std::vector<at::Tensor> GraphedStep::run(const std::vector<at::Tensor>& user_inputs) {
  TORCH_CHECK(user_inputs.size() == static_inputs_.size(), "a callable of make_graphed_callables takes the ",
      static_inputs_.size(), " tensors of its sample_args, got ", user_inputs.size());
  RECORD_FUNCTION("Graphed", std::vector<c10::IValue>());
  autograd::variable_list inputs;
  inputs.reserve(num_inputs());
  inputs.insert(inputs.end(), user_inputs.begin(), user_inputs.end());
  inputs.insert(inputs.end(), params_.begin(), params_.end());
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(!inputs[i]._fw_grad(/*level=*/0).defined(), "make_graphed_callables: a graphed callable has no "
        "forward-mode AD formula, but input ", i, " has a tangent (a dual tensor of torch.autograd.forward_ad)");
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(static_outputs_.size());
  {
    // The copies may wait (a copy from pageable host memory) and so may the replay (a full launch queue).
    py::gil_scoped_release no_gil;
    {
      at::AutoGradMode no_grad(false);
      for (size_t i = 0; i < user_inputs.size(); ++i) {
        if (static_inputs_[i].data_ptr() != user_inputs[i].data_ptr()) {
          static_inputs_[i].copy_(user_inputs[i]);
        }
      }
    }
    forward_graph_->replay();
    for (const at::Tensor& out : static_outputs_) {
      outputs.push_back(out.detach());
    }
  }
  if (!autograd::compute_requires_grad(inputs)) {
    return outputs;  // as an autograd.Function's outputs without grad mode: no node
  }
  auto node = c10::make_intrusive<GraphedBackward>(shared_from_this());
  node->set_next_edges(autograd::collect_next_edges(inputs));
  for (const at::Tensor& out : outputs) {
    if (autograd::isDifferentiableType(out.scalar_type())) {
      autograd::set_history(out, node);
    } else {
      node->add_input_metadata(autograd::Node::undefined_input());
    }
  }
  return outputs;
}

autograd::variable_list GraphedStep::backward(const autograd::variable_list& grads) const {
  py::gil_scoped_acquire gil;
  try {
    py::tuple args(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      args[i] = grads[i].defined() ? py::cast(grads[i]) : py::none();
    }
    const py::object result = backward_(*args);
    autograd::variable_list out;
    out.reserve(num_inputs());
    for (const py::handle g : result) {
      out.push_back(g.is_none() ? at::Tensor() : py::cast<at::Tensor>(g));
    }
    TORCH_CHECK(out.size() == num_inputs(), "make_graphed_callables: the backward function returned ", out.size(),
        " gradients, expected one per input (", num_inputs(), ")");
    return out;
  } catch (py::error_already_set& e) {
    // As autograd.Function's node: the Python exception reaches backward()'s caller as itself.
    e.restore();
    python_error err;
    err.persist();
    throw std::move(err);
  }
}

}  // namespace

void init_graphed_bindings(py::module& m) {
  // See Note [A graphed step without autograd.Function].
  py::class_<GraphedStep, std::shared_ptr<GraphedStep>>(m, "GraphedStep")
      .def(py::init<py::object, std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
          py::object>())
      .def("__call__", &GraphedStep::run);
}

}  // namespace npusim
