// Plan mode's switch: see plan_mode.h.
#include "plan_mode.h"

#include "host_memory.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace npusim {

// Note [Plan mode]
// `npusim plan` (NPUSIM_COMPUTE=plan) runs a job without computing it, so that
// a job bigger than this machine can be sized: every op still launches as a
// stream task, gets its outputs' metadata from its Meta kernel and its outputs
// from the caching allocator in stream order, and takes its modelled time on
// the chip clock, but what the task does to device memory is skipped. So the
// allocator's figures (allocated, reserved, peaks, fragmentation, OOM) and the
// chip-time step are those of the run that computes, and the values are not.
//
// The rule for values: work that touches more than kPlanComputeMaxBytes
// (1 MiB) of device memory, inputs and outputs together, writes nothing, and
// smaller work runs as it would. So the device's large tensors (weights,
// activations, gradients, optimizer states, communication buffers) are never
// written and read as zeros, while the small ones the host's control flow
// reads (position ids, sequence lengths, index arithmetic, small masks, step
// counters, the host's own small tensors copied in) hold the values a
// computing run gives them, as far as they do not derive from large work: a
// loss, the sum over a large tensor, reads 0.0 (a skipped op's fresh outputs
// of at most 1 MiB are cleared, since their block may have held a small
// tensor before; a skipped in-place op leaves its argument as it was).
//
// The device's segments are fresh anonymous mappings with MAP_NORESERVE, and
// a page never written is the kernel's shared zero page when read, so a
// 64 GiB device costs the host only what small work writes, mostly the small
// pool's 2 MiB segments. Each skip is decided when the work runs, so a graph
// replay skips the same work:
//  - op tasks, boxed and unboxed, by their tensors' logical bytes;
//  - copies into npu memory by their bytes (_foreach_copy_ pair by pair, a
//    resize's copy); copies to the host always run;
//  - random fills (the generator's offset still advances);
//  - inductor's compiled kernels, by the npu tensors they are given (a
//    skipped one's outputs keep what their blocks held);
//  - a collective's data movement; in a planned world small collectives are
//    computed as if every rank held this rank's data (Note [A planned
//    world]).
// Ops the host must run (.item(), data-dependent shapes, ops without a Meta
// kernel) run on the host on whatever the device holds. docs/PLAN.md says
// what this does to loss scaling, gradient clipping and MoE routing.
//
// The switch is thrown before the first segment is mapped (the Python layer
// reads NPUSIM_COMPUTE when npusim is imported): mapped pages of a computing
// device hold values a planning one would read.

namespace {
std::atomic<bool> g_plan_mode{false};
}  // namespace

bool device_computes() {
  return !g_plan_mode.load(std::memory_order_relaxed);
}

void set_plan_mode(bool on) {
  if (on == g_plan_mode.load()) {
    return;
  }
  TORCH_CHECK(mapped_segment_bytes() == 0, "npusim: plan mode (NPUSIM_COMPUTE=plan) must be chosen before the "
      "first npu allocation; ", format_bytes(mapped_segment_bytes()), " of device memory is mapped already");
  g_plan_mode.store(on);
}

}  // namespace npusim
