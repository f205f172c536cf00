// Device memory of the simulated NPU (device_allocator.cpp): CUDA's caching
// allocator over host memory, a DeviceCache per device (device_cache.h):
// small and large pools, block splitting and coalescing, blocks kept per
// stream, CUDA's statistics, per-device capacity, stream-ordered release,
// private pools, a host-memory guard. See Note [Caching allocator], Note
// [Stream-ordered free] and Note [Host memory behind the device]. It knows
// nothing of graphs: a graph reaches its private pool through
// begin_allocate_to_pool, which the graph calls.
#pragma once

#include "stream.h"

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace npusim {

c10::Allocator* device_allocator();
// `nbytes` on `device` for the current stream of that device (a private pool's
// when one takes that stream's or this thread's allocations). Thread-safe;
// the block is freed in stream order (Note [Stream-ordered free]).
c10::DataPtr allocate_device(c10::DeviceIndex device, size_t nbytes);
// The same for `stream` (of `device`), current or not.
c10::DataPtr allocate_device(c10::DeviceIndex device, size_t nbytes, const NpuStream& stream);
// Takes ownership of host memory produced by a CPU kernel and accounts it
// as device memory of `device` (raises OutOfMemoryError over capacity).
c10::DataPtr adopt_as_device(c10::DataPtr&& cpu, size_t nbytes, c10::DeviceIndex device);

// Moves freed blocks that no stream can still touch to the cache; returns their bytes.
int64_t reclaim_deferred_frees();
// Cheap when nothing is pending; the streams' completion hook, and called
// before every allocation.
void maybe_reclaim_deferred_frees();
// Returns every free segment to the host (after the device's streams are
// done with them, as CUDA's emptyCache synchronizes).
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

// ---- settings (PYTORCH_NPU_ALLOC_CONF, parsed by Python: npusim.config) ------

constexpr size_t kRoundupIntervals = 16;  // request sizes [1, 2) MiB, [2, 4) MiB, ..., >= 32 GiB
struct AllocatorSettings {
  size_t max_split_size = SIZE_MAX;             // blocks at least this big are "oversize": never split
  size_t max_non_split_rounding = 20 << 20;     // how much bigger an oversize block may be than its request
  size_t large_segment_size = 20 << 20;         // the segments of requests in (1, 10) MiB
  double garbage_collection_threshold = 0.0;    // 0: off
  std::array<size_t, kRoundupIntervals> roundup_power2_divisions{};  // 0 or 1: 512-byte rounding only
  bool expandable_segments = false;             // accepted, no effect (Note [Allocator settings], config.py)
};
void set_allocator_settings(const AllocatorSettings& settings);
AllocatorSettings allocator_settings();
// Called once before the allocator's first use (the first allocation, stats
// or settings call): Python's reading of PYTORCH_NPU_ALLOC_CONF, which calls
// set_allocator_settings. Until it returns without raising, every use calls
// it again. Installed by the Python floor; none: the defaults.
using SettingsInitHook = void (*)();
void set_settings_init_hook(SettingsInitHook hook);
void ensure_allocator_settings();

// ---- snapshots and history (torch.cuda.memory._snapshot) ------------------------

struct BlockSnapshot {
  uintptr_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;
  std::string state;  // active_allocated, active_pending_free, inactive
};
struct SegmentSnapshot {
  c10::DeviceIndex device = 0;
  uintptr_t address = 0;
  size_t total_size = 0;
  size_t allocated_size = 0;
  size_t active_size = 0;
  size_t requested_size = 0;
  int64_t stream = 0;
  bool is_large = false;
  bool adopted = false;  // memory produced by a CPU kernel (never cached)
  c10::MempoolId_t pool{0, 0};
  std::vector<BlockSnapshot> blocks;  // in address order
};
// Every segment of every device ({0, 0}), or of one private pool.
std::vector<SegmentSnapshot> memory_snapshot(c10::MempoolId_t pool = {0, 0});

struct TraceEntry {
  std::string action;  // alloc, free_requested, free_completed, segment_alloc, segment_free, oom
  uintptr_t address = 0;  // oom: the bytes the device had free
  size_t size = 0;
  int64_t stream = 0;
  int64_t time_us = 0;
};
// _record_memory_history: keeps the last `max_entries` events per device.
void record_memory_history(bool enabled, size_t max_entries);
std::vector<TraceEntry> memory_trace(c10::DeviceIndex device);

// ---- private pools (CUDA's createOrIncrefPool, beginAllocateToPool, ...) --------
// A private pool has its own small and large pools: only allocations routed
// to it take its blocks, and blocks freed back to it are reused by its later
// allocations. It lives while any graph, MemPool or allocation scope holds it
// (use count) and, after that, until its segments are free and empty_cache
// releases them.

// A fresh pool id: {0, n} for pools a user makes (graph_pool_handle,
// MemPool), {n, 0} for a graph's own; never {0, 0}.
c10::MempoolId_t new_mempool_id(bool user_created);
// Creates the pool on `device` (use count 1) or adds a user.
void create_or_incref_pool(c10::DeviceIndex device, c10::MempoolId_t id, bool no_split = false,
    bool use_on_oom = false);
// Until end_allocate_to_pool, allocations on `stream` (graph capture) come
// from pool `id`, which the scope holds (create_or_incref).
void begin_allocate_to_pool(const NpuStream& stream, c10::MempoolId_t id);
// ... or the calling thread's allocations on `device` (use_mem_pool).
void begin_allocate_current_thread_to_pool(c10::DeviceIndex device, c10::MempoolId_t id);
// A stream that joined a capture (Note [Multi-stream capture]) allocates from
// the pool its capture's origin stream allocates from, under that scope's hold.
void join_allocate_to_pool(const NpuStream& stream, c10::MempoolId_t id);
// Ends the scope begun for `id` (the pool stays held until release_pool).
void end_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t id);
// Ends the scope of `stream` for `id` (begun or joined).
void end_allocate_to_pool(const NpuStream& stream, c10::MempoolId_t id);
// Drops one user; at zero the pool's free segments go at the next empty_cache.
void release_pool(c10::DeviceIndex device, c10::MempoolId_t id);
int pool_use_count(c10::DeviceIndex device, c10::MempoolId_t id);
// The addresses of the pool's allocated blocks.
std::vector<const void*> pool_live_allocations(c10::DeviceIndex device, c10::MempoolId_t id);

// A private pool's layout (CUDA's PrivatePoolState): each segment's blocks
// with their addresses, sizes and whether they were allocated.
struct PoolCheckpoint {
  struct BlockState {
    void* ptr;
    size_t size;
    bool allocated;
    c10::StreamId stream;
  };
  c10::DeviceIndex device = 0;
  c10::MempoolId_t pool{0, 0};
  std::vector<std::vector<BlockState>> segments;
};
// What restoring a checkpoint changed: the allocations it freed (live in the
// pool, not in the checkpoint) and DataPtrs of the ones it made (in the
// checkpoint, not live), which the caller hands to the tensors that stand for them.
struct RestoredPool {
  std::vector<void*> freed;
  std::vector<c10::DataPtr> allocated;
};
std::shared_ptr<PoolCheckpoint> checkpoint_pool(c10::DeviceIndex device, c10::MempoolId_t id);
// The pool's every segment of the checkpoint must still exist.
RestoredPool restore_pool(const PoolCheckpoint& checkpoint);

// ---- blocks lent to CPU kernels (cpu_allocator.cpp) ----------------------------

// Whether `ptr` is an allocated block of `device`'s pool (not adopted memory).
bool is_lent_block(c10::DeviceIndex device, const void* ptr);
// Frees the block at `ptr`, as its npu DataPtr's deleter would.
void free_block_at(c10::DeviceIndex device, void* ptr);
// The ordinary npu DataPtr of the block at `ptr`.
c10::DataPtr claim_block(c10::DeviceIndex device, void* ptr);

}  // namespace npusim
