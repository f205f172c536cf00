// The device type of npu tensors, shared by the core and the collective backend.
#pragma once

#include <c10/core/DeviceType.h>

namespace npusim {

constexpr auto kNpu = c10::DeviceType::PrivateUse1;

}  // namespace npusim
