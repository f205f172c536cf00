// Device memory of the simulated NPU (device_allocator.cpp): a caching
// allocator with a pool per device, CUDA's statistics, per-device capacity,
// and stream-ordered release (see Note [Stream-ordered free] and Note
// [Caching allocator]). It knows nothing of graphs: a private pool reaches
// it through begin_allocate_to_pool, which the graph calls.
#pragma once

#include "stream.h"

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace npusim {

c10::Allocator* device_allocator();
c10::DataPtr allocate_device(c10::DeviceIndex device, size_t nbytes);
// Takes ownership of host memory produced by a CPU kernel and accounts it
// as device memory of `device` (raises OutOfMemoryError over capacity).
c10::DataPtr adopt_as_device(c10::DataPtr&& cpu, size_t nbytes, c10::DeviceIndex device);

// Moves freed blocks that no stream can still touch to the cache; returns their bytes.
int64_t reclaim_deferred_frees();
// Cheap when nothing is pending; the streams' completion hook, and called
// before every allocation.
void maybe_reclaim_deferred_frees();
// Returns every cached (free, untouchable) block to the host.
void empty_cache();
void reset_peak_stats(c10::DeviceIndex device);
void reset_accumulated_stats(c10::DeviceIndex device);
// Tensor.record_stream: the block is not reused before `stream`'s work
// enqueued before its free has finished.
void record_stream(const c10::DataPtr& data, const c10::Stream& stream);

// CUDA's statistics (allocation, segment, active, *_bytes, ...).
c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex device);
// Total device memory (the profile's HBM size by default; -1: unlimited) and
// the fraction of it this process may reserve (set_per_process_memory_fraction).
int64_t memory_capacity(c10::DeviceIndex device);
void set_memory_capacity(c10::DeviceIndex device, int64_t bytes);
double memory_fraction(c10::DeviceIndex device);
void set_memory_fraction(c10::DeviceIndex device, double fraction);
// (free, total): total is the capacity, free what is not reserved.
std::pair<size_t, size_t> memory_info(c10::DeviceIndex device);

// PYTORCH_NPU_ALLOC_CONF, parsed once by Python (npusim.config) and held here.
struct AllocatorSettings {
  size_t max_split_size = SIZE_MAX;  // blocks at least this big are "oversize"
  double garbage_collection_threshold = 0.0;  // 0: off
  size_t roundup_power2_divisions = 0;  // 0 or 1: round to 512 bytes only
};
void set_allocator_settings(const AllocatorSettings& settings);
AllocatorSettings allocator_settings();

struct BlockSnapshot {
  uintptr_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;
  std::string state;  // active_allocated, active_pending_free, inactive
};
// One segment per host allocation: npusim never splits a segment, so each
// holds exactly one block.
struct SegmentSnapshot {
  c10::DeviceIndex device = 0;
  uintptr_t address = 0;
  size_t total_size = 0;
  int64_t stream = 0;
  bool is_large = false;
  bool adopted = false;  // memory produced by a CPU kernel (never cached)
  BlockSnapshot block;
};
std::vector<SegmentSnapshot> memory_snapshot();

struct TraceEntry {
  std::string action;  // alloc, free_requested, free_completed, segment_alloc, segment_free, oom
  uintptr_t address = 0;
  size_t size = 0;
  int64_t stream = 0;
  int64_t time_us = 0;
};
// _record_memory_history: keeps the last `max_entries` events per device.
void record_memory_history(bool enabled, size_t max_entries);
std::vector<TraceEntry> memory_trace(c10::DeviceIndex device);

// ---- private pools (CUDA's beginAllocateToPool) -------------------------------

// A pool that takes the allocations made while one stream is current (an
// npu graph's, Note [NPU graph memory]).
class PrivatePool {
 public:
  virtual ~PrivatePool() = default;
  virtual c10::DataPtr allocate(c10::DeviceIndex device, size_t nbytes) = 0;
};
// Until end_allocate_to_pool(stream), device_allocator()'s allocations on
// stream's device while `stream` is the current stream come from `pool`.
void begin_allocate_to_pool(const NpuStream& stream, PrivatePool* pool);
void end_allocate_to_pool(const NpuStream& stream);

// ---- blocks lent to CPU kernels (cpu_allocator.cpp) ----------------------------

// Whether `ptr` is an allocated block of `device`'s pool (not adopted memory).
bool is_lent_block(c10::DeviceIndex device, const void* ptr);
// Frees the block at `ptr`, as its npu DataPtr's deleter would.
void free_block_at(c10::DeviceIndex device, void* ptr);
// The ordinary npu DataPtr of the block at `ptr`.
c10::DataPtr claim_block(c10::DeviceIndex device, void* ptr);

}  // namespace npusim
