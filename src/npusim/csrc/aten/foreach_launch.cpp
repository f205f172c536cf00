// The npu kernel of the _foreach_* ops: see foreach_launch.h.
#include "foreach_launch.h"

#include "fallback.h"
#include "../runtime/npu_type.h"

#include <string_view>

namespace npusim {

// Note [A foreach op is one launch]
// CUDA and torch_npu give the _foreach_* ops device kernels of their own
// (CUDA's multi_tensor_apply, op-plugin's foreach kernels): an optimizer's
// foreach step is a few launches, each over all its parameters. npu had
// none, so its slot held the composite that CPU runs, a loop that launched
// each tensor's op on its own: the foreach AdamW step of a model with 6
// parameters was 48 launches instead of 8, each paying the host's launch
// cost and the stream worker's per-task cost, and the step's host time was
// twice CPU's. Now a foreach op is one task (the CPU fallback, Note [Compute
// on the stream]) whose CPU kernel is that same composite over CPU aliases:
// the results are CPU's bit for bit, the profiler shows one aten::_foreach_*
// device activity per call, and a graph capture records one op.
//
// The one launch is taken when every tensor of the call's lists is on one
// npu and each single tensor argument is on that npu or a 0-dim CPU tensor
// (a scalar). Otherwise the composite runs as before and launches each
// tensor's op on its own device: that is what CUDA does with lists its
// fused kernels refuse (tensors on several devices), and a CPU tensor in a
// list gets each op's own device-rule error.

bool foreach_op_takes_one_launch(const c10::OperatorHandle& op) {
  const std::string_view name = op.operator_name().name;
  return name.rfind("aten::_foreach_", 0) == 0 && !op.hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) &&
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
}

namespace {

// Whether every tensor on `stack` from `first` on is on one npu (0-dim CPU
// tensors outside lists aside) and there is at least one.
bool on_one_npu(const torch::jit::Stack& stack, size_t first) {
  c10::DeviceIndex device = -1;
  auto same_npu = [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNpu) {
      return false;
    }
    if (device < 0) {
      device = t.device().index();
    }
    return t.device().index() == device;
  };
  for (size_t i = first; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!same_npu(t) && !(t.defined() && t.device().is_cpu() && t.dim() == 0)) {
        return false;
      }
    } else if (v.isTensorList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (!same_npu(e.toTensor())) {
          return false;
        }
      }
    }
  }
  return device >= 0;
}

}  // namespace

void foreach_launch(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t first = stack->size() - op.schema().arguments().size();
  if (on_one_npu(*stack, first)) {
    npu_fallback(op, stack);
    return;
  }
  // The composite, which CPU's slot holds (foreach_op_takes_one_launch).
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

}  // namespace npusim
