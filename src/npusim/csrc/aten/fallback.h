// The boxed CPU fallback (fallback.cpp), for kernels that adjust an op's
// arguments and then run CPU's kernel on the device memory, and the routing
// of structured ops to it (fallback_routes.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <map>
#include <string>
#include <vector>

namespace npusim {

// Runs `op` with PyTorch's CPU kernel on CPU views of the npu arguments on
// `stack` and leaves npu results on the stack: as a task on the current
// stream of its npu (Note [Compute on the stream]), or on the host after the
// stream's earlier work. Enforces CUDA's device rules; see Note [Device rules
// of the fallback].
void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Registers the fallback as the npu kernel of every aten op whose npu slot
// would otherwise hold a composite kernel where CPU has a kernel of its own
// (see Note [Structured ops go straight to the fallback] and Note [CPU's
// kernel, not the composite]), except the ops named in
// `cuda_runs_the_composite` ("aten::pixel_shuffle"): npu_fallback itself, or
// for the hottest an unboxed kernel over the same FallbackCall (Note
// [Unboxed fallback kernels]). Routes once: later calls return the first
// call's result. The _foreach_* ops, whose composite CPU runs too, get the
// one-launch kernel (Note [A foreach op is one launch]). Returns the routed
// ops' names ("aten::add.Tensor"), each with "unboxed", "boxed" or "foreach",
// and aten::addr_ with "checked in place" (Note [addr_ is in place by
// identity]).
std::map<std::string, std::string> route_structured_ops_to_fallback(
    const std::vector<std::string>& cuda_runs_the_composite);

}  // namespace npusim
