// The allocator lent to CPU kernels (cpu_allocator.cpp): PyTorch's CPU
// allocator, except that inside a CpuAllocationsOnDevice scope it hands out
// blocks of the npu caching allocator. See Note [CPU kernels allocate device
// memory].
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace npusim {

// While alive, this thread's CPU allocations come from `device`'s caching
// allocator (-1: from PyTorch's CPU allocator again); scopes nest.
class CpuAllocationsOnDevice {
 public:
  explicit CpuAllocationsOnDevice(c10::DeviceIndex device);
  ~CpuAllocationsOnDevice();
  CpuAllocationsOnDevice(const CpuAllocationsOnDevice&) = delete;
  CpuAllocationsOnDevice& operator=(const CpuAllocationsOnDevice&) = delete;

 private:
  c10::DeviceIndex saved_;
};
// Makes PyTorch's CPU allocator honour CpuAllocationsOnDevice; idempotent.
void install_cpu_allocator();
// Memory that a CPU kernel produced, as device memory of `device`: a block
// it allocated inside a CpuAllocationsOnDevice scope as it is, anything else
// adopted (adopt_as_device).
c10::DataPtr as_device_memory(c10::DataPtr&& cpu, size_t nbytes, c10::DeviceIndex device);

}  // namespace npusim
