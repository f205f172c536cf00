// Plan mode: the device launches, allocates and keeps time as it does when it
// computes, but no kernel runs and device memory is not backed by the host's
// (Note [Plan mode], plan_mode.cpp).
#pragma once

namespace npusim {

// False in plan mode: the tasks that would write device memory (kernels,
// copies into the device, random fills, collectives' data) do nothing.
bool device_computes();

// Switches plan mode on or off. Only before the first segment of device
// memory is mapped: a device whose memory holds values cannot stop computing
// halfway, nor one whose zero pages are shared start (raises otherwise).
void set_plan_mode(bool on);

}  // namespace npusim
