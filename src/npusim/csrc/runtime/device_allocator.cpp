// Device memory of the simulated NPU: the face of the per-device caching
// allocators (device_cache.cpp): c10's DeviceAllocator, npu DataPtrs and
// their stream-ordered free, settings, statistics, snapshots, private pools.
// Pinned host memory is host_allocator.cpp's, the allocator lent to CPU
// kernels cpu_allocator.cpp's.
#include "device_allocator.h"

#include "device_cache.h"
#include "host_memory.h"
#include "trace.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

namespace npusim {

// Note [Stream-ordered free]
// Device memory is host memory that stream workers read and write after the
// host has moved on. A block freed by the host (tensor dropped, FSDP's
// storage.resize_(0)) may still be the target of queued work. CUDA relies on
// stream order and record_stream for that: a block freed on its allocation
// stream is free at once, for that stream's next allocations, and only a
// recorded stream's unfinished work holds it back. npusim's host-side kernels
// and comm threads would make a missing record_stream a silent data race, so
// it also waits for every other stream that had unfinished work at the free,
// Holding the block back until then makes which block an allocation gets, and
// so `allocated` (block sizes: a large block's rest of up to 1 MiB is not
// split off) and `reserved`, depend on how far the workers had run; waiting
// for them when the block is handed out instead makes the figures a function
// of the program but couples the host to the other streams' progress (an
// FSDP2 step of `bench fsdp-step`, whose comm runs gloo in real time, took
// 1.09-1.22 of CPU+gloo's time against 0.79-0.90: three alternating pairs of
// runs, stop 47). So the choice follows the chip clock, which is on for the
// figures (npusim report, npusim plan, NPUSIM_TIMING) and off for speed:
//  - work left only on the block's own stream is ordered before anything the
//    block's next owner enqueues there (a block is only ever reused on that
//    stream, Note [Caching allocator]): the free is complete at once; the
//    stream's task count is kept with the block (own_fence), and its memory
//    goes back to the host only once the stream has passed it;
//  - other streams' unfinished work, under the chip clock
//    (Block::unfinished): the block is free at once too, as on CUDA, and
//    best fit chooses it as CUDA's would; the
//    allocation that takes it waits, in this machine's time only (the chip
//    clock does not move: on the chip the block is free), until those streams
//    have passed that work, which was enqueued before the free and needs no
//    host action. A wait that does not end within kDeferredFreeWait (a
//    stream held by a collective whose peer waits on this host) or would be a
//    stream worker's puts the block back as a deferred free and takes
//    another (Note [Bounded deferred frees]). Its segment goes back to the
//    host only once they have passed;
//  - other streams' unfinished work off the chip clock, and
//    Tensor.record_stream's streams (as on CUDA): the block is a deferred
//    free, out of its pool, until they pass.
// So under the chip clock allocated, reserved and their peaks are a function
// of the program, as on CUDA for a program that needs no record_stream (an
// FSDP2 job of 2 ranks under npusim report gave both ranks the same peaks in
// six runs on a loaded machine, where one run in four differed before).
// `allocated` drops at once, as on CUDA; `active` counts a deferred free
// until it completes.

namespace {

std::array<DeviceCache, kMaxDevices>& g_caches = *new std::array<DeviceCache, kMaxDevices>();
std::atomic<SettingsInitHook> g_settings_hook{nullptr};
std::atomic<bool> g_settings_ready{false};
std::atomic<uint64_t> g_next_pool_uid{1};

// Reports an allocation or free to torch.profiler and the sanitizer. Called
// without the cache lock: the sanitizer's observer takes the GIL, and a thread
// holding the GIL may be waiting for the lock (a deadlock seen in FSDP2).
void report_memory(DeviceCache& c, void* ptr, int64_t delta, std::unique_lock<std::mutex>& lock) {
  const int64_t allocated = c.stats.allocated_bytes[0].current;
  const int64_t reserved = c.reserved();
  lock.unlock();
  note_memory(ptr, delta, allocated, reserved, c.device);
}

DeviceCache& cache(c10::DeviceIndex device, const char* op) {
  check_device_index(device, op);
  // The streams' completion hook releases deferred frees; installed with the
  // first use of a cache, before any free can be deferred.
  static const bool hooked = [] {
    for (c10::DeviceIndex d = 0; d < kMaxDevices; ++d) {
      g_caches[d].device = d;
    }
    add_completion_hook(&maybe_reclaim_deferred_frees);
    return true;
  }();
  (void)hooked;
  return g_caches[device];
}

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  auto fences = pending_stream_fences();
  DeviceCache& c = g_caches[b->device];
  std::unique_lock<std::mutex> lock(c.mutex);
  void* const ptr = b->ptr;  // b may be merged away below
  const auto size = static_cast<int64_t>(b->size);
  c.free_locked(b, std::move(fences));
  report_memory(c, ptr, -size, lock);
}

c10::DataPtr data_ptr_of(Block* b) {
  return c10::DataPtr(b->ptr, b, &free_block, c10::Device(c10::DeviceType::PrivateUse1, b->device));
}

// A c10::DeviceAllocator so that torch.accelerator's memory functions work.
class DeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_device(current_device(), nbytes);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t) override {
    empty_cache();
  }
  void recordStream(const c10::DataPtr& data, c10::Stream stream) override {
    record_stream(data, stream);
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return device_stats(device);
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    reset_accumulated_stats(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    reset_peak_stats(device);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    return memory_info(device);
  }
};

}  // namespace

// ---- settings ------------------------------------------------------------------------

void set_settings_init_hook(SettingsInitHook hook) {
  g_settings_hook.store(hook);
}

void ensure_allocator_settings() {
  if (C10_LIKELY(g_settings_ready.load(std::memory_order_acquire))) {
    return;
  }
  // The hook's own calls into the allocator (setting fractions) need no settings first.
  thread_local bool reading = false;
  if (reading) {
    return;
  }
  // No lock around the hook: it takes the GIL, and a thread holding the GIL
  // may be waiting for a lock of ours. Two threads may both read the
  // settings; they read the same.
  if (SettingsInitHook hook = g_settings_hook.load()) {
    reading = true;
    try {
      hook();
    } catch (...) {
      reading = false;
      throw;  // not ready: the next use reads the settings again
    }
    reading = false;
  }
  g_settings_ready.store(true, std::memory_order_release);
}

// ---- allocation and free ---------------------------------------------------------------

void maybe_reclaim_deferred_frees() {
  if (g_pending_frees.load(std::memory_order_acquire) > 0) {
    reclaim_deferred_frees();
  }
}

c10::Allocator* device_allocator() {
  static DeviceAllocator allocator;
  return &allocator;
}

namespace {

c10::DataPtr allocate_on(DeviceCache& c, size_t nbytes, c10::StreamId stream) {
  ensure_allocator_settings();
  maybe_reclaim_deferred_frees();
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::PrivateUse1, c.device));
  }
  std::unique_lock<std::mutex> lock(c.mutex);
  for (;;) {
    Block* b = c.malloc_locked(nbytes, stream, lock);
    std::vector<Fence> unfinished = std::move(b->unfinished);  // b is the caller's now: Note [Stream-ordered free]
    b->unfinished.clear();
    if (!unfinished.empty()) {
      lock.unlock();
      const bool passed = DeviceCache::wait_for_unfinished(unfinished);
      lock.lock();
      if (!passed) {
        // The other stream is held by work that needs this host (a collective
        // whose peer waits on it), or this is a stream worker: the block waits
        // out of the pool as a deferred free, and another one is taken.
        c.free_locked(b, std::move(unfinished), /*reusable_now=*/false);
        continue;
      }
    }
    report_memory(c, b->ptr, static_cast<int64_t>(b->size), lock);
    return data_ptr_of(b);
  }
}

}  // namespace

c10::DataPtr allocate_device(c10::DeviceIndex device, size_t nbytes, const NpuStream& stream) {
  DeviceCache& c = cache(device, "npu allocate");
  TORCH_CHECK(stream.device() == device, "npu allocate: a stream of npu:", static_cast<int>(stream.device()),
      " for memory of npu:", static_cast<int>(device));
  return allocate_on(c, nbytes, stream.id());
}

c10::DataPtr allocate_device(c10::DeviceIndex device, size_t nbytes) {
  DeviceCache& c = cache(device, "npu allocate");
  start_runtime();
  return allocate_on(c, nbytes, current_stream(device).id());
}

c10::DataPtr adopt_as_device(c10::DataPtr&& cpu, size_t nbytes, c10::DeviceIndex device) {
  DeviceCache& c = cache(device, "npu adopt");
  ensure_allocator_settings();
  const c10::StreamId stream = current_stream(device).id();
  std::unique_lock<std::mutex> lock(c.mutex);
  Block* b = c.adopt_locked(std::move(cpu), nbytes, stream, lock);  // on failure `cpu` frees the memory
  report_memory(c, b->ptr, static_cast<int64_t>(b->size), lock);
  return data_ptr_of(b);
}

int64_t reclaim_deferred_frees() {
  int64_t moved = 0;
  for (int d = 0; d < device_count(); ++d) {
    DeviceCache& c = g_caches[d];
    std::lock_guard<std::mutex> lock(c.mutex);
    moved += c.reclaim_locked();
  }
  return moved;
}

void empty_cache() {
  // As CUDA's caching allocator (its captures_underway assertion); see Note
  // [Capture-time refusals].
  TORCH_CHECK(!any_stream_capturing(), "empty_cache: not permitted while an npu graph capture is underway "
      "(the blocks the capture records into its graph must stay put); empty the cache before capture_begin "
      "or after capture_end");
  for (int d = 0; d < device_count(); ++d) {
    DeviceCache& c = cache(static_cast<c10::DeviceIndex>(d), "empty_cache");
    std::unique_lock<std::mutex> lock(c.mutex);
    c.empty_cache_locked(lock, /*synchronize=*/true);
  }
}

void record_stream(const c10::DataPtr& data, const c10::Stream& stream) {
  if (data.get_deleter() != &free_block || data.get_context() == nullptr) {
    return;  // zero-size or not ours: nothing can be reused early
  }
  auto* b = static_cast<Block*>(data.get_context());
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
      "record_stream: expected an npu stream for a tensor on npu:", static_cast<int>(b->device), ", got a stream of ",
      stream.device());
  TORCH_CHECK(stream.device_index() == b->device, "record_stream: the stream is on npu:",
      static_cast<int>(stream.device_index()), " but the tensor's memory is on npu:", static_cast<int>(b->device));
  stream_for(stream);  // validates the stream id
  DeviceCache& c = g_caches[b->device];
  std::lock_guard<std::mutex> lock(c.mutex);
  c.record_stream_locked(b, stream.id());
}

// ---- statistics and capacity ---------------------------------------------------------------

namespace {

template <typename Fn>
void for_each_stat(c10::CachingDeviceAllocator::DeviceStats& s, Fn fn) {
  for (StatArray* array : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
           &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (auto& stat : *array) {
      fn(stat);
    }
  }
  fn(s.oversize_allocations);
  fn(s.oversize_segments);
}

}  // namespace

void reset_peak_stats(c10::DeviceIndex device) {
  DeviceCache& c = cache(device, "reset_peak_memory_stats");
  std::lock_guard<std::mutex> lock(c.mutex);
  for_each_stat(c.stats, [](c10::CachingAllocator::Stat& stat) { stat.reset_peak(); });
}

void reset_accumulated_stats(c10::DeviceIndex device) {
  DeviceCache& c = cache(device, "reset_accumulated_memory_stats");
  std::lock_guard<std::mutex> lock(c.mutex);
  auto& s = c.stats;
  for_each_stat(s, [](c10::CachingAllocator::Stat& stat) { stat.reset_accumulated(); });
  s.num_alloc_retries = 0;
  s.num_ooms = 0;
  s.num_sync_all_streams = 0;
  s.num_device_alloc = 0;
  s.num_device_free = 0;
}

c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex device) {
  DeviceCache& c = cache(device, "memory_stats");
  ensure_allocator_settings();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto out = c.stats;
  out.max_split_size = static_cast<int64_t>(settings().max_split_size);  // unlimited: -1, as CUDA reports it
  return out;
}

int64_t memory_capacity(c10::DeviceIndex device) {
  return cache(device, "memory capacity").capacity.load();
}

void set_memory_capacity(c10::DeviceIndex device, int64_t bytes) {
  cache(device, "set_memory_capacity").capacity = bytes < 0 ? -1 : bytes;
}

double memory_fraction(c10::DeviceIndex device) {
  DeviceCache& c = cache(device, "get_per_process_memory_fraction");
  ensure_allocator_settings();
  return c.fraction.load();
}

void set_memory_fraction(c10::DeviceIndex device, double fraction) {
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "set_per_process_memory_fraction: invalid fraction ", fraction,
      "; expected a number in [0, 1]");
  DeviceCache& c = cache(device, "set_per_process_memory_fraction");
  ensure_allocator_settings();  // PYTORCH_NPU_ALLOC_CONF's fraction first, the caller's over it
  c.fraction = fraction;
}

std::pair<size_t, size_t> memory_info(c10::DeviceIndex device) {
  DeviceCache& c = cache(device, "mem_get_info");
  const int64_t cap = c.capacity.load();
  if (cap < 0) {
    return {0, 0};
  }
  std::lock_guard<std::mutex> lock(c.mutex);
  return {static_cast<size_t>(std::max<int64_t>(0, cap - c.reserved())), static_cast<size_t>(cap)};
}

// ---- snapshots and history -----------------------------------------------------------------

std::vector<SegmentSnapshot> memory_snapshot(c10::MempoolId_t pool) {
  std::vector<SegmentSnapshot> out;
  for (int d = 0; d < device_count(); ++d) {
    DeviceCache& c = cache(static_cast<c10::DeviceIndex>(d), "memory_snapshot");
    std::lock_guard<std::mutex> lock(c.mutex);
    auto segments = c.snapshot_locked(pool);
    std::move(segments.begin(), segments.end(), std::back_inserter(out));
  }
  return out;
}

void record_memory_history(bool enabled, size_t max_entries) {
  g_trace_max = max_entries;
  g_trace_enabled = enabled;
  for (auto& c : g_caches) {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (!enabled) {
      c.trace.clear();
    }
  }
}

std::vector<TraceEntry> memory_trace(c10::DeviceIndex device) {
  DeviceCache& c = cache(device, "memory trace");
  std::lock_guard<std::mutex> lock(c.mutex);
  return {c.trace.begin(), c.trace.end()};
}

// ---- private pools -----------------------------------------------------------------------------

c10::MempoolId_t new_mempool_id(bool user_created) {
  const uint64_t uid = g_next_pool_uid.fetch_add(1);
  return user_created ? c10::MempoolId_t{0, uid} : c10::MempoolId_t{uid, 0};
}

void create_or_incref_pool(c10::DeviceIndex device, c10::MempoolId_t id, bool no_split, bool use_on_oom) {
  DeviceCache& c = cache(device, "npu private pool");
  std::lock_guard<std::mutex> lock(c.mutex);
  c.create_or_incref_pool_locked(id, no_split, use_on_oom);
}

void begin_allocate_to_pool(const NpuStream& stream, c10::MempoolId_t id) {
  DeviceCache& c = cache(stream.device(), "npu private pool");
  std::lock_guard<std::mutex> lock(c.mutex);
  c.begin_allocate_to_pool_locked(id, AllocationScope{id, stream.id(), {}});
}

void begin_allocate_current_thread_to_pool(c10::DeviceIndex device, c10::MempoolId_t id) {
  DeviceCache& c = cache(device, "npu private pool");
  std::lock_guard<std::mutex> lock(c.mutex);
  c.begin_allocate_to_pool_locked(id, AllocationScope{id, -1, std::this_thread::get_id()});
}

void end_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t id) {
  DeviceCache& c = cache(device, "npu private pool");
  std::lock_guard<std::mutex> lock(c.mutex);
  c.end_allocate_to_pool_locked(id);
}

void join_allocate_to_pool(const NpuStream& stream, c10::MempoolId_t id) {
  DeviceCache& c = cache(stream.device(), "npu private pool");
  std::lock_guard<std::mutex> lock(c.mutex);
  c.join_allocate_to_pool_locked(id, stream.id());
}

void end_allocate_to_pool(const NpuStream& stream, c10::MempoolId_t id) {
  DeviceCache& c = cache(stream.device(), "npu private pool");
  std::lock_guard<std::mutex> lock(c.mutex);
  c.end_allocate_to_pool_locked(id, stream.id());
}

void release_pool(c10::DeviceIndex device, c10::MempoolId_t id) {
  DeviceCache& c = cache(device, "npu private pool");
  std::lock_guard<std::mutex> lock(c.mutex);
  c.release_pool_locked(id);
}

int pool_use_count(c10::DeviceIndex device, c10::MempoolId_t id) {
  DeviceCache& c = cache(device, "npu private pool");
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.pool_use_count_locked(id);
}

std::vector<const void*> pool_live_allocations(c10::DeviceIndex device, c10::MempoolId_t id) {
  DeviceCache& c = cache(device, "npu private pool");
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.pool_live_allocations_locked(id);
}

std::shared_ptr<PoolCheckpoint> checkpoint_pool(c10::DeviceIndex device, c10::MempoolId_t id) {
  DeviceCache& c = cache(device, "npu private pool checkpoint");
  maybe_reclaim_deferred_frees();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.checkpoint_pool_locked(id);
}

RestoredPool restore_pool(const PoolCheckpoint& checkpoint) {
  DeviceCache& c = cache(checkpoint.device, "npu private pool restore");
  std::lock_guard<std::mutex> lock(c.mutex);
  auto [freed, blocks] = c.restore_pool_locked(checkpoint);
  RestoredPool out;
  out.freed = std::move(freed);
  for (Block* b : blocks) {
    out.allocated.push_back(data_ptr_of(b));
  }
  return out;
}

// ---- blocks lent to CPU kernels ----------------------------------------------------------------

bool is_lent_block(c10::DeviceIndex device, const void* ptr) {
  DeviceCache& c = g_caches[device];
  std::lock_guard<std::mutex> lock(c.mutex);
  const Block* b = c.allocated_block(ptr);
  return b != nullptr && !b->adopted;
}

void free_block_at(c10::DeviceIndex device, void* ptr) {
  Block* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_caches[device].mutex);
    b = g_caches[device].allocated_block(ptr);
  }
  TORCH_INTERNAL_ASSERT(b != nullptr, "npu free: no block at ", ptr, " on npu:", static_cast<int>(device));
  free_block(b);
}

c10::DataPtr claim_block(c10::DeviceIndex device, void* ptr) {
  Block* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_caches[device].mutex);
    b = g_caches[device].allocated_block(ptr);
  }
  TORCH_INTERNAL_ASSERT(b != nullptr, "npu claim: no block at ", ptr, " on npu:", static_cast<int>(device));
  return data_ptr_of(b);
}

}  // namespace npusim
