// A launched op's task, run by the stream worker: see op_task.h.
#include "op_task.h"

#include "../host_transfer.h"
#include "../intraop_threads.h"
#include "../op_traits.h"
#include "../../runtime/plan_mode.h"

#include <ATen/core/List.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace npusim {

namespace {
// Results TaskAliases::place copied into the output the host allocated.
std::atomic<int64_t> g_results_copied_into_place{0};
}  // namespace

at::Tensor TaskAliases::get(int32_t ref) {
  if (ref == kUndefinedRef) {
    return at::Tensor();
  }
  if (ref < 0) {
    return tensors_.held[static_cast<size_t>(-2 - ref)];
  }
  const TensorSnapshot& s = tensors_.tensors[static_cast<size_t>(ref)];
  c10::Storage& shared = storages_[static_cast<size_t>(s.group)];
  at::Tensor alias = take_cpu_alias(s.source(), shared ? &shared : nullptr);
  if (!shared) {
    shared = alias.storage();
  }
  return alias;
}

at::Tensor TaskAliases::own(int32_t snapshot) {
  return take_cpu_alias(tensors_.tensors[static_cast<size_t>(snapshot)].source(), nullptr);
}

void TaskAliases::place(const at::Tensor& result, int32_t snapshot, const char* op) {
  TORCH_CHECK(result.defined(), op, ": the CPU kernel returned no tensor where the Meta kernel returned one");
  const TensorSnapshot& planned = tensors_.tensors[static_cast<size_t>(snapshot)];
  TORCH_CHECK(result.sizes().equals(planned.geometry.sizes), op, ": the CPU kernel's result has shape ",
      result.sizes(), " where the Meta kernel's has shape ", c10::IntArrayRef(planned.geometry.sizes));
  if (!planned.geometry.describes(result, planned.data)) {
    g_results_copied_into_place.fetch_add(1, std::memory_order_relaxed);
    // An out= kernel that restrided the output it was given left its result
    // in the output's own bytes: copied out of them first.
    const char* base = static_cast<const char*>(planned.data);
    const char* at = result.has_storage() ? static_cast<const char*>(result.storage().data()) : nullptr;
    const bool over_output = at >= base && at < base + planned.nbytes;
    host_copy(get(snapshot), over_output ? result.clone() : result);
  }
}

int64_t results_copied_into_place() {
  return g_results_copied_into_place.load(std::memory_order_relaxed);
}

bool TaskTensors::kernel_runs() const {
  if (device_computes()) {
    return true;
  }
  size_t bytes = 0;  // the tensors as the kernel sees them (a view's elements, not its storage's)
  for (const TensorSnapshot& s : tensors) {
    bytes += static_cast<size_t>(c10::multiply_integers(s.geometry.sizes)) * c10::elementSize(s.geometry.dtype);
  }
  return work_runs(bytes);
}

void TaskTensors::clear_output(int32_t snapshot) const {
  const TensorSnapshot& s = tensors[static_cast<size_t>(snapshot)];
  if (s.nbytes <= kPlanComputeMaxBytes) {  // a larger block is the large pool's, which only small work writes
    std::memset(s.data, 0, s.nbytes);  // a fresh output owns its storage
  }
}

KernelScope::KernelScope(const TaskTensors& tensors) {
  int64_t largest = 0;  // a foreach op runs a kernel per tensor: the largest one tells the kernel's size
  if (tensors.pointwise) {  // only a pointwise kernel's team depends on its size (Note [A core for the host])
    for (const TensorSnapshot& s : tensors.tensors) {
      largest = std::max(largest, c10::multiply_integers(s.geometry.sizes));
    }
    for (const at::Tensor& t : tensors.held) {
      largest = std::max(largest, t.numel());
    }
  }
  apply_user_intraop_threads(largest, tensors.pointwise);  // Note [Intra-op threads of autograd's npu thread]
}

// Note [A foreach op's results in place]
// The CPU composite of a functional foreach op allocates each result and
// the task then copies it into the output the host allocated at launch
// (TaskAliases::place): an allocation, a free and a copy per tensor. For
// AdamW's _foreach_sqrt in the dispatch-bound MLP step of `bench sim-cost`
// the stream worker took 91 us (median per step, 2 cores), more than any
// other foreach op of the step (lerp_ 40 us). A unary foreach op's
// composite calls aten::X per tensor, so its task calls aten::X.out per
// tensor instead, into the host's outputs: the same kernel, which the out=
// variant runs into the output it is given, the same values, no copy; the
// sqrt then took 55 us. Only when each output is fresh and of its input's
// dtype (sqrt of integers gives floats: the composite converts); every
// other foreach op keeps the composite.
namespace {
std::atomic<int64_t> g_foreach_results_in_place{0};
}  // namespace

int64_t foreach_results_in_place_runs() {
  return g_foreach_results_in_place.load(std::memory_order_relaxed);
}

void OpTask::run() const {
  if (!kernel_runs()) {  // Note [Plan mode]
    for (const FreshOutput& f : fresh) {
      clear_output(f.snapshot);
    }
    return;
  }
  const KernelScope scope(*this);
  TaskAliases aliases(*this);
  if (per_tensor_out != nullptr) {
    g_foreach_results_in_place.fetch_add(1, std::memory_order_relaxed);
    const ArgSlot& inputs = args[0];
    torch::jit::Stack stack;
    for (size_t i = 0; i < fresh.size(); ++i) {
      stack.clear();
      stack.emplace_back(aliases.get(inputs.refs[i]));
      stack.emplace_back(aliases.get(fresh[i].snapshot));
      per_tensor_out->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
    }
    return;
  }
  torch::jit::Stack stack;
  stack.reserve(args.size());
  for (const ArgSlot& arg : args) {
    stack.push_back(slot_value(arg, [&](int32_t ref) { return aliases.get(ref); }));
  }
  for (const auto& [i, state] : generators) {
    stack[i] = c10::IValue(cpu_generator_from(state.unpack()));
  }
  if (functional_out != nullptr) {  // Note [A functional op's results in place]
    if (!functional_out->extra.isNone()) {
      stack.push_back(functional_out->extra);
    }
    for (const FreshOutput& f : fresh) {
      stack.emplace_back(aliases.own(f.snapshot));  // an out= kernel that resizes its output leaves ours be
    }
    functional_out->op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  } else {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  }
  // The returns, in order: the outputs given to an out= variant come back as
  // they went, and place copies nothing for them.
  for (const FreshOutput& f : fresh) {
    const c10::IValue& r = stack[f.ret];
    aliases.place(f.elem < 0 ? r.toTensor() : r.toTensorList().get(static_cast<size_t>(f.elem)), f.snapshot, name);
  }
}

}  // namespace npusim
