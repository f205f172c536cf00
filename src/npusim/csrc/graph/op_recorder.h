// Recording of one fallback op into an npu graph capture (op_recorder.cpp):
// the hook the graph installs in the boxed fallback. See Note [NPU graph capture].
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace npusim {

// Records `op` into the capture of its stream (outputs from the op's meta
// shapes, in the pool) and leaves the outputs on the stack. False (stack
// untouched) when that stream is not captured. The device rules are the
// fallback's (op_arguments.h): an op that eager would refuse is refused here.
bool capture_fallback_op(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace npusim
