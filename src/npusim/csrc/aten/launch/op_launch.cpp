// The launch of a fallback op as a stream task: see op_launch.h.
#include "op_launch.h"

#include "boxed_launch.h"
#include "launch_scan.h"
#include "written_overlap.h"
#include "../op_traits.h"
#include "../../runtime/plan_mode.h"

#include <torch/csrc/autograd/function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <string>

namespace npusim {

// Note [Compute on the stream]
// On CUDA a kernel launch returns at once and the kernel runs later on its
// stream; so does an npu compute op. Every op that reaches the CPU fallback
// (boxed npu_fallback and the unboxed kernels of the hottest ops) is launched
// by the host thread in three steps:
//  1. its arguments are walked under the fallback's device rules (Note
//     [Device rules of the fallback]), so that a refused op raises at the
//     call; every npu tensor is recorded with the storage it shares;
//  2. its outputs' metadata comes from its Meta kernel (wrapping each npu
//     argument in a Meta tensor) or from this thread's cache of earlier
//     answers (Note [Cached output metadata]); an out= argument the Meta
//     kernel resized is resized on the host now (CUDA's resize_output also
//     runs on the host at launch), and fresh outputs are allocated from the
//     caching allocator on the current stream, in stream order, exactly
//     where the host would have allocated them before;
//  3. a task (OpTask, op_task.h) is enqueued on the current stream of the
//     op's npu, holding snapshots of the npu tensors as they are now (their
//     memory and geometry: the host may free, resize or restride a tensor
//     right after the call), copies of CPU scalars and CPU indices (the host
//     may change them; CUDA reads them at launch as well), a CPU generator
//     seeded now from the npu one (so random draws keep the order of their
//     launches), and the outputs to fill. The worker makes CPU aliases of the
//     snapshots and runs the CPU kernel on them; the unboxed hot ops call
//     their out= variant, which writes the host's outputs directly, and any
//     other op's results are copied into them.
// Memory the task reads or writes stays valid until it has run: a free
// waits for every stream with unfinished work (Note [Stream-ordered free]),
// and every host write to npu memory is itself stream-ordered or waits for
// the stream (copies, random ops, resizes, ops run on the host). A graph
// capture is the same launch with "record" instead of "push": the stream
// hands the task to the capture (NpuStream::enqueue), the allocator serves
// the outputs from the graph's pool, and a replay runs the same OpTask.
// A pure view (nothing written, every output an argument's storage) needs
// no task at all.
//
// What the host must see synchronizes, as on CUDA; each of these runs the
// op on the host after the stream's earlier work (the fallback's host path,
// wait_current_stream_idle), or under capture raises CUDA's "operation not
// permitted when stream is capturing" and invalidates the capture:
//  - ops returning host values (`equal`, `is_nonzero`, `_local_scalar_dense`
//    and so `.item()`, `.tolist()`, printing; OpTraits::host_only);
//  - data-dependent output shapes (`nonzero`, `unique`, `masked_select`,
//    boolean indexing) and ops without a Meta kernel: their Meta kernel
//    fails, and that answer is cached per signature;
//  - results a Meta kernel gives on the CPU or in another layout (the host
//    path raises npu's strided-only error for the latter);
//  - ops whose CPU kernel is a Python function (a stream worker never takes
//    the GIL: the host may hold it while it waits for the stream);
//  - reads of device data by the host itself: copies to pageable host memory,
//    `.cpu()`, a bernoulli_ whose probabilities the host checks.
// Random ops of random_ops.cpp take their Philox (seed, offset) on the host at
// launch and fill on the stream. Small work on an idle stream may be done by
// the host instead (Note [Work on an idle stream]): its result is the same,
// in the same stream order. NPUSIM_LAUNCH_BLOCKING=1 makes every launch wait
// for its task, so every op runs before its call returns.

namespace {

std::atomic<ComputeCostHook> g_compute_cost_hook{nullptr};
std::atomic<uint64_t> g_compute_cost_epoch{1};

}  // namespace

void set_compute_cost_hook(ComputeCostHook hook) {
  invalidate_compute_costs();
  g_compute_cost_hook.store(hook, std::memory_order_release);
}

void invalidate_compute_costs() {
  g_compute_cost_epoch.fetch_add(1, std::memory_order_acq_rel);
}

uint64_t compute_cost_epoch() {
  return g_compute_cost_epoch.load(std::memory_order_acquire);
}

ComputeCostHook compute_cost_hook() {
  return g_compute_cost_hook.load(std::memory_order_acquire);
}

// Note [Work on an idle stream] has the rule; kHostComputeMaxElements is its threshold for compute.
constexpr int64_t kHostComputeMaxElements = 1 << 14;

// NPUSIM_SMALL_OPS_ON_THE_HOST=0 turns the rule off for compute: every op is
// a stream task, as a large one is, so that a sweep of small samples (the
// OpInfo conformance sweep's --stream-tasks) checks the task path: the
// outputs planned at launch from the Meta kernel, the task's CPU kernel.
std::atomic<bool> g_small_ops_on_the_host{true};

// Note [No compute on the host in a backward pass]
// Autograd runs an npu backward on its device thread, which, like CUDA's,
// only launches: the user's thread sleeps until the pass is done and the
// stream worker, busy since the forward, is awake. Small compute that
// thread did in place on an idle stream (Note [Work on an idle stream])
// saved no wake-up, ran on data in the worker's cache, and gave the thread
// an OpenMP team of its own (the user's count: Note [Intra-op threads of
// autograd's npu thread]). That was one runnable thread more on the
// machine's cores. In fresh processes of the dispatch-bound MLP step of
// `bench sim-cost` on 2 cores (steps 250-599, 12 alternating pairs, stop
// 37), the step took 0.535-0.615 ms with every backward op launched and
// 0.635-0.748 ms with the small ones done in place. Before, about one
// process in five ran at 0.75-0.85 ms, and per-thread traces of such
// processes showed autograd's thread or its OpenMP team thread on the
// worker's core; with it none did (docs/BENCHMARKS.md). So inside a
// backward pass compute is always a stream task, except under
// NPUSIM_LAUNCH_BLOCKING=1 (where everything runs in place) and for ops
// that must run on the host (OpTraits::host_only). The values are the same
// either way.
bool compute_on_the_host_now(const NpuStream& stream, int64_t numel) {
  if (!launch_blocking() && torch::autograd::get_current_node() != nullptr) {
    return false;  // Note [No compute on the host in a backward pass]
  }
  if (!device_computes()) {
    return false;  // a task that computes nothing (Note [Plan mode])
  }
  return g_small_ops_on_the_host.load(std::memory_order_relaxed) && done_on_the_host_now(stream) &&
      compute_cost_hook() == nullptr &&
      (launch_blocking() || numel <= kHostComputeMaxElements);
}

void set_small_ops_on_the_host(bool on) {
  g_small_ops_on_the_host.store(on, std::memory_order_relaxed);
}

bool compute_on_the_host_now(const LaunchScan& scan) {
  return compute_on_the_host_now(scan.stream(), scan.numel);
}

// Note [complex32 on the host]
// CPU has kernels for few ops of complex32 (ComplexHalf, which PyTorch marks
// experimental): add, mul, cat, copies and views take it, acos, exp, div and
// sum raise "not implemented for 'ComplexHalf'", and npu does not compute
// them otherwise (Note [Dtypes CUDA accepts and CPU refuses]). A launch
// cannot tell which: the Meta kernel takes every dtype, and only the CPU
// kernel refuses, when it runs. As a stream task (a large op, any op in a
// backward pass) that refusal failed the device for the rest of the process
// (Note [Errors of asynchronous work]), for a call whose only fault is its
// dtype. So an op with a complex32 npu argument runs on the host after the
// stream's earlier work (the fallback's host path, which waits for it), as
// ops whose result the host must see do: CPU's error raises from the call
// and the device stays usable; what CPU computes is the same either way. A
// capture still records it. The unboxed hot ops take the boxed route for it
// (UnboxedFallback::call), whose launch_boxed declines it.
//
// Note [out= tensors of another dtype]
// An out= tensor whose dtype is not the op's result dtype is the same kind
// of fault. CPU's structured kernels without a TensorIterator (softmax,
// cumsum, amax, sort, index_select, tril, the linalg solvers, ...) refuse it
// ("Expected out tensor to have dtype float, but got double instead"), as
// CUDA's do from the call, while TensorIterator kernels (add, eq) cast into
// it; most of their Meta kernels (the Python ones of
// torch._meta_registrations and torch._refs) take any dtype the result can
// be cast to. So a launch could not tell, and the task failed the device:
// a sweep of op_db's out= ops at float32 with outs of float64, float16,
// int64, bool and complex64, every op a stream task, failed it 339 times
// over 60 ops. A launch of an out= op (OpTraits::functional_of_out) now asks
// the functional overload's Meta kernel for the result's dtypes, with the
// plan, once per signature; where an out= tensor's differs, the op runs on
// the host after the stream's earlier work, and CPU raises or casts. Such
// calls are rare outside tests (out= into a buffer of the result's dtype is
// the common use), so the host path costs nothing that matters. A capture
// still records them, as it records complex32 ops.
bool launch_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpTraits& traits = op_traits(op);
  const size_t first = stack->size() - op.schema().arguments().size();
  LaunchScan scan;
  scan.add_stack(*stack, first);
  StreamCapture* const capture = scan.stream().capture();
  if (capture == nullptr && (traits.host_only != nullptr || scan.complex_half || compute_on_the_host_now(scan) ||
                             written_overlap(*stack, first, traits.uses))) {  // Note [Written tensors that overlap]
    return false;
  }
  if (traits.host_check != nullptr) {
    traits.host_check(op, *stack, first);  // Note [Argument checks of CPU kernels]
  }
  BoxedLaunch launch(op, traits);
  launch.walk(*stack, first);  // the device rules raise here, captured or not
  if (traits.host_only != nullptr) {
    capture->refuse(c10::str("operation not permitted when stream is capturing: ", traits.name, " ",
        traits.host_only));
  }
  NpuStream& target = current_stream(launch.device());
  const MetaPlan* plan = launch.plan();
  if (target.capture() != nullptr) {
    if (plan == nullptr) {
      target.capture()->refuse(c10::str("npu graph capture: ", traits.name, " cannot be captured: ",
          launch.why_host()));
    }
    if (launch.args().capture_refuses_resize()) {
      target.capture()->refuse(c10::str("npu graph capture: ", launch.args().resize_message(),
          " during capture; allocate outputs with their final shape before capturing"));
    }
  } else if (plan == nullptr || plan->outs_of_another_dtype) {
    return false;  // Note [out= tensors of another dtype]
  }
  launch.commit(*plan, target, stack, first);
  return true;
}

}  // namespace npusim
