// Plan mode: the device launches, allocates and keeps time as it does when it
// computes, but no kernel runs and device memory is not backed by the host's
// (Note [Plan mode], plan_mode.cpp).
#pragma once

#include <cstddef>

namespace npusim {

// False in plan mode: the tasks that would write device memory (kernels,
// copies into the device, random fills, collectives' data) do nothing.
bool device_computes();

// Plan mode still runs work that touches at most this many bytes of device
// memory, inputs and outputs together (Note [Plan mode]).
constexpr size_t kPlanComputeMaxBytes = size_t{1} << 20;

// Whether work touching `device_bytes` of npu memory runs: always on a
// computing device; in plan mode only small work.
inline bool work_runs(size_t device_bytes) {
  return device_computes() || device_bytes <= kPlanComputeMaxBytes;
}

// Switches plan mode on or off. Only before the first segment of device
// memory is mapped: a device whose memory holds values cannot stop computing
// halfway, nor one whose zero pages are shared start (raises otherwise).
void set_plan_mode(bool on);

}  // namespace npusim
