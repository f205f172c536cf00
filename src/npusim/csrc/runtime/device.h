// The simulated devices of one process: how many, which one is current on
// this thread, the fork guard and launch blocking. Names follow the ACL / CUDA
// runtime calls they stand for. The floor below everything else of the core.
#pragma once

#include "npu_type.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace npusim {

int device_count();
// Only allowed before the first device is touched.
void set_device_count(int count);
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
// npu `index` when it is not this thread's current device, else nothing: for
// a c10::OptionalDeviceGuard that switches only when needed (the guard's
// exchange costs two device calls).
inline std::optional<c10::Device> npu_unless_current(c10::DeviceIndex index) {
  return current_device() == index ? std::nullopt : std::optional<c10::Device>(c10::Device(kNpu, index));
}
// Also raises in a child forked after the npu was used (Note [Fork after npu use]).
void check_device_index(int64_t index, const char* op);
// True in a child process forked after the parent used the npu.
bool in_bad_fork();
// Fixes the device count: called when the streams are created.
void mark_devices_in_use();

// NPUSIM_LAUNCH_BLOCKING, parsed by Python (npusim.config) and set here.
void set_launch_blocking(bool blocking);
bool launch_blocking();

// Makes the calling thread a stream worker of `device` (streams only).
void enter_stream_worker(c10::DeviceIndex device);
// True on a stream's worker thread (which must never wait on streams).
bool on_stream_worker();

}  // namespace npusim
