// The npu kernel of the _foreach_* ops: one launch per call when the lists
// are on one npu (foreach_launch.cpp; Note [A foreach op is one launch]).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace npusim {

// Whether `op` is a _foreach_* op that takes the one-launch kernel: its npu
// and CPU slots would hold the composite (a CompositeExplicitAutograd
// kernel, no CPU kernel of its own).
bool foreach_op_takes_one_launch(const c10::OperatorHandle& op);

// The boxed npu kernel of those ops: the CPU fallback as one task when every
// tensor of the call is on one npu (a CPU scalar tensor aside), else the
// composite, which launches each tensor's op on its own.
void foreach_launch(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

}  // namespace npusim
