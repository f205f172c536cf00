// The intra-op thread count of npu kernels on autograd's device thread
// (intraop_threads.cpp; Note [Intra-op threads of autograd's npu thread]).
#pragma once

namespace npusim {

// Called by every fallback op before its CPU kernel runs: outside a
// backward pass it records the calling thread's intra-op thread count; inside
// one it applies the recorded count to the calling thread when they differ.
void follow_user_intraop_threads();

// Called by a stream worker before it runs an op's CPU kernel: applies the
// user's count (recorded on the host by follow_user_intraop_threads) to the
// worker when they differ.
void apply_user_intraop_threads();

}  // namespace npusim
