// The intra-op thread count of npu kernels on autograd's device thread
// (intraop_threads.cpp; Note [Intra-op threads of autograd's npu thread]).
#pragma once

#include <cstdint>

namespace npusim {

// Called by every fallback op before its CPU kernel runs: outside a
// backward pass it records the calling thread's intra-op thread count; inside
// one it applies the recorded count to the calling thread when they differ.
void follow_user_intraop_threads();

// The cores this process may run on (its affinity mask), read once.
int usable_cores();

// The team a stream worker runs a kernel whose largest tensor holds
// `elements` elements with, given the user's count and whether the op is
// pointwise (its result then does not depend on the team): Note [A core for
// the host].
int worker_intraop_threads(int user, int64_t elements, bool pointwise);

// Called by a stream worker before it runs an op's CPU kernel whose largest
// tensor holds `elements` elements: applies the user's count (recorded on
// the host by follow_user_intraop_threads), less a core for the host for a
// small pointwise kernel, to the worker when it differs.
void apply_user_intraop_threads(int64_t elements, bool pointwise);

}  // namespace npusim
