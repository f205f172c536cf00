// Argument checks that an op's CPU kernel makes and its Meta kernel does
// not, made on the host at an npu launch: see Note [Argument checks of CPU
// kernels] (host_checks.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string_view>

namespace npusim {

// Raises the CPU kernel's error for the arguments stack[first:] of `op` when
// that kernel would refuse them; returns otherwise.
using HostCheck = void (*)(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first);

// The check of the op named `full_name` ("aten::multinomial.out"), or null
// when the op needs none.
HostCheck host_check_of(std::string_view full_name);

}  // namespace npusim
