// Device and pinned host memory of the simulated NPU (memory.cpp): allocation
// with per-device accounting and capacity, and stream-ordered release (see
// Note [Stream-ordered free]).
#pragma once

#include "runtime.h"

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>

namespace npusim {

// ---- memory ---------------------------------------------------------------

struct MemoryStats {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak_allocated{0};
  std::atomic<int64_t> reserved{0};  // allocated + freed-but-still-in-use
  std::atomic<int64_t> peak_reserved{0};
  std::atomic<int64_t> capacity{-1};  // -1: unlimited
  std::atomic<int64_t> num_allocs{0};
  std::atomic<int64_t> num_ooms{0};
};
MemoryStats& memory_stats(c10::DeviceIndex device);

c10::Allocator* device_allocator();
c10::Allocator* pinned_allocator();
c10::DataPtr allocate_device(c10::DeviceIndex device, size_t nbytes);
// Takes ownership of host memory produced by a CPU kernel and accounts it
// as device memory of `device` (raises OutOfMemoryError over capacity).
c10::DataPtr adopt_as_device(c10::DataPtr&& cpu, size_t nbytes, c10::DeviceIndex device);
c10::DataPtr allocate_pinned(size_t nbytes);
bool is_pinned_ptr(const void* ptr);
// Frees what no stream can still touch; returns bytes released.
int64_t reclaim_deferred_frees();
// Cheap when nothing is pending; called after every task and allocation.
void maybe_reclaim_deferred_frees();
void empty_cache();
void reset_peak_stats(c10::DeviceIndex device);

}  // namespace npusim
