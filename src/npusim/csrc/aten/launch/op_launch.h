// Compute ops as stream tasks (op_launch.cpp): the launch of a fallback op on
// the current stream (outputs sized by its Meta kernel, allocated on the host
// in stream order, its CPU kernel run by the stream's worker), the rule for
// when it runs on the host instead, and the compute-cost hook of the timing
// model. See Note [Compute on the stream].
#pragma once

#include "launch_scan.h"
#include "../../runtime/stream.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <vector>

namespace npusim {

// ---- the compute-cost hook ----------------------------------------------------
//
// Under the timing model a compute task should last what the op would take
// on the profile's chip. The layer that models that (npusim.runtime's cost
// model) installs a hook here; while one is installed every compute op is a
// stream task (never done on the host), and at its launch, on the launching
// host thread (no GIL held), the hook is called with:
//   op            the operator launched (op.schema(): name, overload, arguments);
//   meta_inputs   the op's arguments in schema order, every npu tensor as a
//                 Meta tensor of its sizes, strides and dtype (views of one
//                 storage share one Meta storage), CPU scalars as they are,
//                 devices as "meta";
//   meta_outputs  the op's returns as its Meta kernel gave them (Meta
//                 tensors, lists of them, None).
// It returns the task's duration in microseconds (<= 0: none), which the
// stream worker holds the stream for before it runs the kernel
// (NpuStream::enqueue's duration_us). An exception it throws propagates out
// of the op's call, before anything is enqueued. The hook must not call npu
// ops. Install nullptr to remove it. Ops that run on the host (the cases of
// Note [Compute on the stream]) are not given to the hook.
using ComputeCostHook = double (*)(const c10::OperatorHandle& op, const std::vector<c10::IValue>& meta_inputs,
    const std::vector<c10::IValue>& meta_outputs);
void set_compute_cost_hook(ComputeCostHook hook);
// The hook's answers so far are stale (the timing model or the profile changed).
void invalidate_compute_costs();
// The current costs' epoch (never 0).
uint64_t compute_cost_epoch();
ComputeCostHook compute_cost_hook();

// ---- launching ------------------------------------------------------------------

// Enqueues boxed `op` (its arguments on top of `stack`) on the current stream
// of its npu and leaves its npu outputs on the stack; the host returns at
// once. Returns false, with the stack untouched, when the op runs on the host
// instead (the caller, the fallback, runs it). Raises what the op would
// raise on the host before anything is enqueued: the device rules' errors,
// out of memory for an output; and, while the op's stream is being captured
// by an npu graph, CUDA's error for an op that cannot be captured. An op
// with a complex32 argument runs on the host: Note [complex32 on the host].
bool launch_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Whether an op on `stream` whose npu arguments hold `numel` elements in all
// runs on the host now rather than as a task: see Note [Work on an idle stream].
bool compute_on_the_host_now(const NpuStream& stream, int64_t numel);
// The same for an op whose arguments `scan` has seen, on its npu's current
// stream: the one host-or-stream decision of the boxed and unboxed launches.
bool compute_on_the_host_now(const LaunchScan& scan);
// NPUSIM_SMALL_OPS_ON_THE_HOST: false makes every compute op a stream task.
void set_small_ops_on_the_host(bool on);

}  // namespace npusim
