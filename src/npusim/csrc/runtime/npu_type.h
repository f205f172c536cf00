// The device type of npu tensors and the sizes of the simulated node: defined
// here once, for the core, the collective backend and (through the bindings,
// runtime/acl.py) Python.
#pragma once

#include <c10/core/DeviceType.h>

namespace npusim {

constexpr auto kNpu = c10::DeviceType::PrivateUse1;

// The NPUs of one Atlas training node: the device count when
// NPUSIM_DEVICE_COUNT is unset, and the most a process may simulate.
constexpr int kDefaultDeviceCount = 8;
constexpr int kMaxDevices = 16;
// Streams per device: the default stream (id 0) plus a pool per priority.
constexpr int kPoolSize = 8;
constexpr int kPriorityLevels = 2;  // 0: normal, 1: high (priority < 0)
constexpr int kStreamsPerDevice = 1 + kPoolSize * kPriorityLevels;

}  // namespace npusim
