// See boxed_launch.h and Note [Compute on the stream] (op_launch.cpp).
#include "boxed_launch.h"

#include "op_launch.h"
#include "../intraop_threads.h"
#include "../op_arguments.h"

#include <ATen/core/List.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace npusim {
namespace {

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

constexpr const char* kNoMeta =
    "its output shapes could not be computed on the meta device (data-dependent shape or no meta kernel)";

}  // namespace

BoxedLaunch::BoxedLaunch(const c10::OperatorHandle& op, const OpTraits& traits) : op_(op), traits_(traits), args_(op) {}

void BoxedLaunch::walk(const torch::jit::Stack& stack, size_t first) {
  const size_t n = op_.schema().arguments().size();
  slots_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    add_argument(stack[first + i], traits_.uses[i], traits_.generator[i]);
  }
}

c10::DeviceIndex BoxedLaunch::device() const {
  return args_.device();
}

const LaunchArgs& BoxedLaunch::args() const {
  return args_;
}

// The outputs' plan, from the cache or the Meta kernel; null when the op
// must run on the host (why_host() says why).
// With the timing model's compute cost on, the plan carries the op's
// duration, asked of the cost hook once per plan and cost epoch.
const MetaPlan* BoxedLaunch::plan() {
  const ComputeCostHook hook = compute_cost_hook();
  const uint64_t epoch = hook != nullptr ? compute_cost_epoch() : 0;
  const MetaPlan* cached = find_meta_plan(args_.key());
  if (cached != nullptr && (cached->host_only || cached->cost_epoch == epoch)) {
    why_host_ = kNoMeta;
    return cached->host_only ? nullptr : cached;
  }
  MetaPlan plan;
  try {
    run_meta(hook != nullptr || traits_.functional_of_out != nullptr);
    args_.plan_from_meta(meta_outputs_, plan);
    plan.outs_of_another_dtype = outs_of_another_dtype();
    if (hook != nullptr) {
      plan.duration_us = hook(op_, meta_inputs_, meta_outputs_);
      plan.cost_epoch = epoch;
    }
  } catch (const std::exception& e) {
    why_host_ = c10::str(kNoMeta, ": ", first_line(e.what()));
    plan = MetaPlan();
    plan.host_only = true;
  }
  if (cached != nullptr && !plan.host_only) {  // a plan of an earlier cost epoch: its cost is renewed
    cached->duration_us = plan.duration_us;
    cached->cost_epoch = plan.cost_epoch;
    return cached;
  }
  if (args_.key().cacheable() && !args_.resizes_arguments()) {
    const MetaPlan* stored = store_meta_plan(args_.key(), std::move(plan));
    return stored->host_only ? nullptr : stored;
  }
  own_plan_ = std::move(plan);
  return own_plan_.host_only ? nullptr : &own_plan_;
}

const std::string& BoxedLaunch::why_host() const {
  return why_host_;
}

// Allocates the outputs, enqueues the task on `stream` and replaces the
// arguments on `stack` with the outputs.
void BoxedLaunch::commit(const MetaPlan& plan, NpuStream& stream, torch::jit::Stack* stack, size_t first) {
  // outputs come from the op's device (and its graph pool)
  const c10::OptionalDeviceGuard guard(npu_unless_current(device()));
  follow_user_intraop_threads();  // Note [Intra-op threads of autograd's npu thread]
  auto task = std::make_shared<OpTask>(op_);
  task->name = traits_.name;
  task->pointwise = traits_.pointwise;
  args_.begin_task(*task, plan);
  std::vector<c10::IValue> outputs;
  outputs.reserve(plan.list_sizes.size());
  size_t next = 0;
  auto output = [&](size_t ret, int32_t elem) {
    int32_t snapshot = -1;
    at::Tensor out = args_.output(plan.outputs[next++], plan, *task, &snapshot);
    if (snapshot >= 0) {
      task->fresh.push_back(FreshOutput{static_cast<uint32_t>(ret), elem, snapshot});
    }
    return out;
  };
  for (size_t ret = 0; ret < plan.list_sizes.size(); ++ret) {
    const int32_t n = plan.list_sizes[ret];
    if (n < 0) {
      at::Tensor out = output(ret, -1);
      const bool optional = op_.schema().returns()[ret].type()->kind() == c10::TypeKind::OptionalType;
      outputs.emplace_back(!out.defined() && optional ? c10::IValue() : c10::IValue(std::move(out)));
      continue;
    }
    c10::List<at::Tensor> list;
    list.reserve(static_cast<size_t>(n));
    for (int32_t j = 0; j < n; ++j) {
      list.push_back(output(ret, j));
    }
    outputs.emplace_back(std::move(list));
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (generator_slots_ & (uint64_t{1} << i)) {
      // As the host run does: a CPU generator seeded from the npu one, now,
      // or, in a capture, from its graph-safe state when the task runs (Note
      // [Graph-safe Philox state]).
      const PhiloxState state = cpu_generator_argument_state(slots_[i].value, args_.rules());
      if (stream.capture() != nullptr) {
        task->generators.emplace_back(static_cast<uint32_t>(i), state);
      } else {
        slots_[i].value = c10::IValue(cpu_generator_from(state.unpack()));
      }
    }
  }
  task->args = std::move(slots_);
  if (traits_.foreach_unary_out != nullptr && results_in_place(*task)) {
    task->per_tensor_out = traits_.foreach_unary_out;  // Note [A foreach op's results in place]
  }
  if (traits_.functional_out != nullptr && generator_slots_ == 0 && returns_fresh(*task, *traits_.functional_out)) {
    task->functional_out = traits_.functional_out;  // Note [A functional op's results in place]
  }
  // A pure view (nothing written, every output an argument's storage)
  // needs no task; an op without outputs runs for its effect (an assert).
  if (args_.written() || !task->fresh.empty() || plan.outputs.empty()) {
    const double duration_us = compute_cost_hook() != nullptr ? plan.duration_us : 0.0;
    // What it reads and writes, for a capture only (Note [Replaying independent tasks at once]).
    const std::optional<TaskAccess> access =
        stream.capture() != nullptr ? std::optional<TaskAccess>(args_.access(*task)) : std::nullopt;
    stream.enqueue([task = std::shared_ptr<const OpTask>(std::move(task))] { task->run(); }, duration_us,
        traits_.name, TaskKind::kWork, access ? &*access : nullptr);
  }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (c10::IValue& v : outputs) {
    stack->push_back(std::move(v));
  }
}

// Whether the outputs of a unary foreach op's task are its fresh
// results, one per input and in order, each of its input's dtype.
bool BoxedLaunch::results_in_place(const OpTask& task) {
  const ArgSlot& inputs = task.args[0];
  if (inputs.kind != ArgSlot::Kind::kTensorList || task.fresh.size() != inputs.refs.size()) {
    return false;
  }
  for (size_t i = 0; i < task.fresh.size(); ++i) {
    const FreshOutput& f = task.fresh[i];
    const int32_t in = inputs.refs[i];
    if (f.ret != 0 || f.elem != static_cast<int32_t>(i) || in < 0 ||
        task.tensors[static_cast<size_t>(in)].geometry.dtype !=
            task.tensors[static_cast<size_t>(f.snapshot)].geometry.dtype) {
      return false;
    }
  }
  return true;
}

// Whether every return of a functional op's task is a fresh output, one
// tensor each and in order, and its input one that `out` takes.
bool BoxedLaunch::returns_fresh(const OpTask& task, const FunctionalOut& out) {
  const size_t returns = task.op.schema().returns().size();
  if (task.fresh.size() != returns) {
    return false;
  }
  for (size_t i = 0; i < returns; ++i) {
    const FreshOutput& f = task.fresh[i];
    const TensorGeometry& planned = task.tensors[static_cast<size_t>(f.snapshot)].geometry;
    // A result with a lazy conjugate (linalg_lu_solve's adjoint) is the functional kernel's own view.
    if (f.ret != i || f.elem != -1 || planned.conj || planned.neg) {
      return false;
    }
  }
  if (out.not_for_bool) {
    const ArgSlot& self = task.args[0];
    return self.kind == ArgSlot::Kind::kTensor && self.refs[0] >= 0 &&
        task.tensors[static_cast<size_t>(self.refs[0])].geometry.dtype != at::kBool;
  }
  return true;
}

void BoxedLaunch::add_argument(const c10::IValue& v, ArgUse use, bool generator) {
  MetaKey& key = args_.key();
  ArgSlot slot;
  if (generator) {
    generator_slots_ |= uint64_t{1} << slots_.size();
    slot.value = v;
    key.add(v.isNone() ? 0x6e01 : 0x6e02);
  } else if (v.isTensor()) {
    slot.kind = ArgSlot::Kind::kTensor;
    slot.refs.push_back(args_.tensor(v.toTensor(), use));
  } else if (v.isTensorList()) {
    slot.kind = ArgSlot::Kind::kTensorList;
    const auto& list = v.toListRef();
    key.add(0x6e03);
    key.add(static_cast<int64_t>(list.size()));
    for (const c10::IValue& e : list) {
      slot.refs.push_back(args_.tensor(e.toTensor(), use));
    }
  } else if (v.isOptionalTensorList()) {
    slot.kind = ArgSlot::Kind::kOptionalTensorList;
    const auto& list = v.toListRef();
    key.add(0x6e04);
    key.add(static_cast<int64_t>(list.size()));
    for (const c10::IValue& e : list) {
      if (e.isNone()) {
        key.add(0x6e05);
        slot.refs.push_back(kUndefinedRef);
      } else {
        slot.refs.push_back(args_.tensor(e.toTensor(), ArgUse::kIndex));
      }
    }
  } else if (v.isDevice() && v.toDevice().type() == kNpu) {
    args_.rules().admit_device(v.toDevice());
    key.add(0x6e06);
    key.add(args_.device());
    slot.value = c10::IValue(c10::Device(c10::DeviceType::CPU));
    npu_device_slots_ |= uint64_t{1} << slots_.size();
  } else {
    add_value_words(key, v, traits_.floating_scalars_by_kind);
    slot.value = v;
  }
  slots_.push_back(std::move(slot));
}

void BoxedLaunch::add_double(MetaKey& key, double d) {
  int64_t bits = 0;
  std::memcpy(&bits, &d, sizeof(bits));
  key.add(bits);
}

// The words of a value argument; floating-point numbers by their kind
// alone when `floats_by_kind` (OpTraits::floating_scalars_by_kind).
void BoxedLaunch::add_value_words(MetaKey& key, const c10::IValue& v, bool floats_by_kind) {
  if (v.isNone()) {
    key.add(0x6e10);
  } else if (v.isInt()) {
    key.add(0x6e11);
    key.add(v.toInt());
  } else if (v.isDouble()) {
    key.add(0x6e12);
    if (!floats_by_kind) {
      add_double(key, v.toDouble());
    }
  } else if (v.isBool()) {
    key.add(0x6e13 + static_cast<int64_t>(v.toBool()));
  } else if (v.isString()) {
    key.add_string(v.toStringView());
  } else if (v.isIntList()) {
    key.add(0x6e15);
    const c10::List<int64_t> list = v.toIntList();
    key.add(static_cast<int64_t>(list.size()));
    for (const int64_t x : list) {
      key.add(x);
    }
  } else if (v.isDevice()) {
    key.add(0x6e16);
    key.add(static_cast<int64_t>(v.toDevice().type()) * 1000 + v.toDevice().index());
  } else if (v.isComplexDouble()) {
    key.add(0x6e17);
    if (!floats_by_kind) {
      const c10::complex<double> c = v.toComplexDouble();
      add_double(key, c.real());
      add_double(key, c.imag());
    }
  } else if (v.isDoubleList()) {
    key.add(0x6e18);
    key.add(static_cast<int64_t>(v.toDoubleList().size()));
    if (!floats_by_kind) {
      for (const double d : v.toDoubleList()) {
        add_double(key, d);
      }
    }
  } else if (v.isBoolList()) {
    key.add(0x6e19);
    for (const bool b : v.toBoolList()) {
      key.add(b);
    }
  } else if (v.isList()) {
    // Scalar[] (the foreach ops' scalar lists): each element's words
    key.add(0x6e1a);
    const auto& list = v.toListRef();
    key.add(static_cast<int64_t>(list.size()));
    for (const c10::IValue& e : list) {
      if (!(e.isInt() || e.isDouble() || e.isBool() || e.isComplexDouble())) {
        key.uncacheable();
        return;
      }
      add_value_words(key, e, floats_by_kind);
    }
  } else {
    key.uncacheable();  // a kind with no words (symbolic ints, objects, tuples)
  }
}

// The dtype CPU's kernel gives a norm's statistics (Note [Statistics dtypes
// of CPU norms], op_traits.cpp) with the Meta stand-ins `inputs`; Undefined
// for other ops.
at::ScalarType BoxedLaunch::stats_dtype_of(const torch::jit::Stack& inputs) const {
  if (traits_.stats_dtype_from < 0) {
    return at::ScalarType::Undefined;
  }
  const c10::IValue& weight = inputs[static_cast<size_t>(traits_.stats_dtype_from)];
  return (weight.isTensor() && weight.toTensor().defined() ? weight : inputs[0]).toTensor().scalar_type();
}

// Runs the dispatcher's Meta kernel (C++, or Python for the ops whose Meta
// kernels torch._meta_registrations provides) on the Meta stand-ins.
void BoxedLaunch::run_meta(bool keep_inputs) {
  args_.make_meta();
  torch::jit::Stack stack;
  stack.reserve(slots_.size());
  const auto meta_of = [this](int32_t ref) { return args_.meta(ref); };
  for (size_t i = 0; i < slots_.size(); ++i) {
    const bool npu_device = (npu_device_slots_ & (uint64_t{1} << i)) != 0;  // "meta" for the Meta kernel
    stack.push_back(npu_device ? c10::IValue(c10::Device(c10::DeviceType::Meta)) : slot_value(slots_[i], meta_of));
  }
  if (keep_inputs) {
    meta_inputs_ = stack;  // for the compute-cost hook and outs_of_another_dtype
  }
  const at::ScalarType stats_dtype = stats_dtype_of(stack);
  // A batch norm out of training: CPU's kernel saves no statistics (empty
  // tensors) where its Meta kernel sizes them by channel.
  const int training = traits_.stats_saved_unless;
  const bool empty_stats = traits_.stats_dtype_from >= 0 &&
      (training == OpTraits::kStatsNever ||
          (training >= 0 && stack[static_cast<size_t>(training)].isBool() &&
              !stack[static_cast<size_t>(training)].toBool()));
  op_.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  if (stats_dtype != at::ScalarType::Undefined) {
    for (size_t i = 1; i < std::min<size_t>(stack.size(), 3); ++i) {  // save_mean, save_rstd
      if (stack[i].isTensor() && stack[i].toTensor().defined()) {
        stack[i] = empty_stats ? at::empty({0}, stack[i].toTensor().options().dtype(stats_dtype))
                               : stack[i].toTensor().to(stats_dtype);
      }
    }
  }
  meta_outputs_ = std::move(stack);
}

bool BoxedLaunch::outs_of_another_dtype() const {
  const c10::OperatorHandle* functional = traits_.functional_of_out;
  if (functional == nullptr) {
    return false;
  }
  const size_t first_out = meta_inputs_.size() - traits_.out_args;
  torch::jit::Stack stack(meta_inputs_.begin(), meta_inputs_.begin() + static_cast<std::ptrdiff_t>(first_out));
  try {
    functional->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const std::exception&) {
    return true;  // no answer: the host's CPU kernel decides
  }
  const at::ScalarType stats_dtype = stats_dtype_of(meta_inputs_);
  for (size_t i = 0; i < traits_.out_args && i < stack.size(); ++i) {
    const c10::IValue& out = meta_inputs_[first_out + i];
    if (!out.isTensor() || !stack[i].isTensor() || !out.toTensor().defined() || !stack[i].toTensor().defined()) {
      continue;
    }
    const bool statistic = stats_dtype != at::ScalarType::Undefined && (i == 1 || i == 2);  // as run_meta's
    if (out.toTensor().scalar_type() != (statistic ? stats_dtype : stack[i].toTensor().scalar_type())) {
      return true;
    }
  }
  return false;
}

}  // namespace npusim
