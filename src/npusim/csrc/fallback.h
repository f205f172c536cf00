// The boxed CPU fallback (fallback.cpp), for kernels that adjust an op's
// arguments and then run CPU's kernel on the device memory.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace npusim {

// Runs `op` with PyTorch's CPU kernel on CPU views of the npu arguments on
// `stack`, after the current stream's earlier work, and leaves npu results
// on the stack. Enforces CUDA's device rules; see Note [Device rules of the
// fallback].
void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Whether a schema argument is a `Generator?`: the fallback and graph capture
// give random ops the npu generator's stream there.
bool is_optional_generator(const c10::Argument& arg);

}  // namespace npusim
