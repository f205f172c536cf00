// torch.profiler's PrivateUse1 extension points for the npu streams: a kineto
// activity profiler (device tasks as device activities) and the legacy
// profiler's stubs (device time per op from events). See Note [Device tasks
// in torch.profiler].
#pragma once

namespace npusim {

// Registers both with PyTorch; once, at device registration.
void register_device_profiler();

}  // namespace npusim
