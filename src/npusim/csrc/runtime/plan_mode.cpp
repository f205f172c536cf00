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
// The rule for values: device memory is never written, so every byte of it
// reads as zero. The device's segments are fresh anonymous mappings with
// MAP_NORESERVE (no swap reserved for them), and a page never written is the
// kernel's shared zero page when read, so a 64 GiB device costs the host only
// the page tables of what is read. Skipped (each checks device_computes() when
// it runs, so that a graph replay of them is skipped too): op tasks (the boxed
// and the unboxed launch), copies whose destination is npu memory (host to
// device, device to device, _foreach_copy_'s batches, a resize's copy), random
// fills, inductor's compiled kernels, and the collectives' data movement (the
// hccl backend of a planned world moves nothing). Kept, because they write
// host memory only: copies from npu to the host, which copy the zeros. Ops
// the host must run (.item(), data-dependent shapes, ops without a Meta
// kernel) still run on the host, on the zeros: `.item()` of a loss reads 0.0,
// `nonzero` finds nothing, and their outputs (small, host-sized) are the one
// device memory plan mode writes. docs/PLAN.md says what zeros do to loss
// scaling, gradient clipping and MoE routing.
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
