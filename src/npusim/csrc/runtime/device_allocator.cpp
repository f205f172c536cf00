// Device memory of the simulated NPU: a caching allocator with per-device
// pools, accounting (CUDA's DeviceStats) and capacity, and stream-ordered
// release. Pinned host memory is host_allocator.cpp's, the allocator lent to
// CPU kernels cpu_allocator.cpp's.
#include "device_allocator.h"

#include "host_memory.h"
#include "trace.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace npusim {

// Note [Stream-ordered free]
// Device memory is host memory that stream workers read and write after the
// host has moved on. A block freed by the host (tensor dropped, FSDP's
// storage.resize_(0)) may still be the target of queued work, so it is not
// handed out again until every stream that had pending work at the time of
// the free (and every stream recorded with Tensor.record_stream) has passed
// that point. This is stricter than CUDA, which waits only for recorded
// streams: npusim's host-side kernels and comm threads make a missing
// record_stream a silent data race, so it is never relied on. The one
// relaxation is CUDA's: a block whose only unfinished work is on the stream
// it was allocated on may be reused by an allocation on that same stream,
// whose work is ordered after it (allocations are made by host threads at a
// launch; a stream worker allocates nothing from this pool). `allocated` drops at once, as on CUDA;
// `reserved` counts the block until it is returned to the host.

// Note [Caching allocator]
// Each block is one host allocation (a "segment" of one block: npusim never
// splits). Requests are rounded up to 512 bytes (and to a power-of-two
// division with roundup_power2_divisions); the small pool holds blocks under
// 1 MiB, the large pool the rest. A freed block that no stream can touch is
// cached per (device, allocation stream, size); an allocation takes a cached
// block of its stream and exact size (an oversize block, at least
// max_split_size, serves any request within 20 MiB below it, as on CUDA).
// Over capacity the cache is returned to the host and the allocation retried
// (num_alloc_retries), then the device is synchronized and retried once more,
// then OutOfMemoryError. Memory that a CPU kernel allocated outside the
// caching allocator (see Note [CPU kernels allocate device memory]) is
// adopted: accounted, but never cached, since the CPU allocator owns it.


namespace {

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = 1 << 20;
constexpr size_t kLargeBuffer = 20 << 20;


int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Block {
  void* ptr = nullptr;
  size_t size = 0;  // bytes of the segment (accounted size)
  size_t requested = 0;
  c10::DeviceIndex device = -1;  // -1: pinned host memory
  c10::StreamId stream = 0;      // allocation stream
  c10::DataPtr adopted;          // memory produced by a CPU kernel
  bool allocated = false;
  std::vector<c10::StreamId> recorded;  // Tensor.record_stream (same device)
};

struct PendingFree {
  Block* block;
  std::vector<Fence> fences;
  const std::atomic<uint64_t>* own_counter;  // the allocation stream's
};

using StatArray = c10::CachingDeviceAllocator::StatArray;

struct DevicePool {
  std::mutex mutex;
  c10::CachingDeviceAllocator::DeviceStats stats;
  std::multimap<std::pair<c10::StreamId, size_t>, Block*> cached;
  std::vector<PendingFree> pending;
  // Every live segment by address: for snapshots, and to find the block of
  // memory lent to a CPU kernel (Note [CPU kernels allocate device memory]).
  std::unordered_map<const void*, Block*> blocks;
  std::deque<TraceEntry> trace;
  std::atomic<int64_t> capacity{-1};
  std::atomic<double> fraction{1.0};
};

std::array<DevicePool, kMaxDevices>& g_pools = *new std::array<DevicePool, kMaxDevices>();
std::atomic<size_t> g_pending_count{0};
// Private pools by (device, stream): see begin_allocate_to_pool.
std::atomic<int> g_routed_streams{0};
std::array<std::atomic<PrivatePool*>, kMaxDevices * kStreamsPerDevice> g_routes{};
std::atomic<bool> g_trace_enabled{false};
std::atomic<size_t> g_trace_max{0};

std::mutex& g_settings_mutex = *new std::mutex();
AllocatorSettings g_settings;



// The aggregate and the block's pool (small or large); several per
// allocation and free, so written out rather than looped.
inline void update(StatArray& stat, size_t block_size, int64_t amount) {
  auto& pool = stat[block_size < kSmallSize ? 1 : 2];
  if (amount >= 0) {
    stat[0].increase(static_cast<size_t>(amount));
    pool.increase(static_cast<size_t>(amount));
  } else {
    stat[0].decrease(static_cast<size_t>(-amount));
    pool.decrease(static_cast<size_t>(-amount));
  }
}

void trace_locked(DevicePool& p, const char* action, const Block& b) {
  if (!g_trace_enabled.load(std::memory_order_relaxed)) {
    return;
  }
  p.trace.push_back(TraceEntry{action, reinterpret_cast<uintptr_t>(b.ptr), b.size, b.stream, now_us()});
  while (p.trace.size() > g_trace_max.load()) {
    p.trace.pop_front();
  }
}

size_t round_size(size_t nbytes) {
  size_t divisions = 0;
  {
    std::lock_guard<std::mutex> lock(g_settings_mutex);
    divisions = g_settings.roundup_power2_divisions;
  }
  size_t size = nbytes;
  if (divisions > 1 && size > kMinBlockSize) {
    const size_t floor2 = size_t{1} << (63 - __builtin_clzll(size));
    const size_t step = std::max(floor2 / divisions, kMinBlockSize);
    size = floor2 + (size - floor2 + step - 1) / step * step;
  }
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

int64_t limit_of(const DevicePool& p) {
  const int64_t cap = p.capacity.load();
  return cap < 0 ? -1 : static_cast<int64_t>(static_cast<double>(cap) * p.fraction.load());
}

int64_t reserved_of(const DevicePool& p) {
  return p.stats.reserved_bytes[0].current;
}

// Returns a segment to the host (pool lock held).
void release_locked(DevicePool& p, Block* b) {
  update(p.stats.reserved_bytes, b->size, -static_cast<int64_t>(b->size));
  update(p.stats.segment, b->size, -1);
  if (b->size >= g_settings.max_split_size) {
    p.stats.oversize_segments.decrease(1);
  }
  p.stats.num_device_free += 1;
  trace_locked(p, "segment_free", *b);
  p.blocks.erase(b->ptr);
  if (b->adopted) {
    b->adopted.clear();
  } else {
    std::free(b->ptr);
  }
  delete b;
}

// The block is free and no stream can touch it any more (pool lock held).
void finish_free_locked(DevicePool& p, Block* b) {
  update(p.stats.active, b->size, -1);
  update(p.stats.active_bytes, b->size, -static_cast<int64_t>(b->size));
  b->recorded.clear();
  trace_locked(p, "free_completed", *b);
  if (b->adopted) {
    release_locked(p, b);
  } else {
    p.cached.emplace(std::make_pair(b->stream, b->size), b);
  }
}

int64_t free_cached_locked(DevicePool& p) {
  int64_t released = 0;
  for (auto& [key, b] : p.cached) {
    released += static_cast<int64_t>(b->size);
    release_locked(p, b);
  }
  p.cached.clear();
  return released;
}


// Moves pending frees whose fences have passed into the cache (lock held).
int64_t reclaim_locked(DevicePool& p) {
  int64_t moved = 0;
  // stable_partition, not a hand-written compaction: a self-move of the
  // fences vector would empty it and release a block that is still in use.
  auto keep = std::stable_partition(p.pending.begin(), p.pending.end(), [](const PendingFree& pending) {
    return !std::all_of(pending.fences.begin(), pending.fences.end(), fence_passed);
  });
  for (auto it = keep; it != p.pending.end(); ++it) {
    moved += static_cast<int64_t>(it->block->size);
    finish_free_locked(p, it->block);
  }
  g_pending_count.fetch_sub(static_cast<size_t>(std::distance(keep, p.pending.end())));
  p.pending.erase(keep, p.pending.end());
  return moved;
}

bool is_oversize(size_t size) {
  return size >= g_settings.max_split_size;
}

// A cached or same-stream pending block for `size` on `stream` (lock held).
Block* take_reusable_locked(DevicePool& p, c10::StreamId stream, size_t size, bool* was_active) {
  const bool oversize = is_oversize(size);
  auto it = p.cached.lower_bound({stream, size});
  if (it != p.cached.end() && it->first.first == stream &&
      (it->first.second == size || (oversize && it->first.second < size + kLargeBuffer))) {
    Block* b = it->second;
    p.cached.erase(it);
    *was_active = false;
    return b;
  }
  // Note [Stream-ordered free]: work left only on the block's own stream is
  // ordered before anything the new owner enqueues there.
  for (auto pending = p.pending.begin(); pending != p.pending.end(); ++pending) {
    Block* b = pending->block;
    if (b->stream != stream || b->size != size || b->adopted) {
      continue;
    }
    const bool only_own = std::all_of(pending->fences.begin(), pending->fences.end(), [&](const Fence& f) {
      return f.first == pending->own_counter || fence_passed(f);
    });
    if (only_own) {
      p.pending.erase(pending);
      g_pending_count.fetch_sub(1);
      b->recorded.clear();
      *was_active = true;
      return b;
    }
  }
  return nullptr;
}

void raise_oom(DevicePool& p, c10::DeviceIndex device, size_t nbytes, const std::string& why) {
  p.stats.num_ooms += 1;
  const int64_t limit = limit_of(p);
  const int64_t free_bytes = std::max<int64_t>(0, limit - reserved_of(p));
  const int64_t allocated = p.stats.allocated_bytes[0].current;
  const int64_t reserved = reserved_of(p);
  if (g_trace_enabled.load()) {
    Block fake;
    fake.size = nbytes;
    trace_locked(p, "oom", fake);
  }
  std::ostringstream msg;
  msg << "NPU out of memory on npu:" << static_cast<int>(device) << ". Tried to allocate "
      << format_bytes(static_cast<int64_t>(nbytes)) << " (" << nbytes << " bytes); ";
  if (!why.empty()) {
    msg << why;
  } else {
    msg << "capacity " << format_bytes(limit) << ", " << format_bytes(allocated) << " allocated, "
        << format_bytes(reserved) << " reserved, " << format_bytes(free_bytes) << " free (" << free_bytes
        << " bytes).";
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
}

bool over_limit(const DevicePool& p, size_t nbytes) {
  const int64_t limit = limit_of(p);
  return limit >= 0 && reserved_of(p) + static_cast<int64_t>(nbytes) > limit;
}

// Makes room for a new segment of `nbytes` (the lock is held on entry and
// exit; it is dropped to synchronize the device).
void make_room(std::unique_lock<std::mutex>& lock, DevicePool& p, c10::DeviceIndex device, size_t nbytes) {
  const double gc = g_settings.garbage_collection_threshold;
  const int64_t limit = limit_of(p);
  if (gc > 0 && limit >= 0 && reserved_of(p) + static_cast<int64_t>(nbytes) >
      static_cast<int64_t>(gc * static_cast<double>(limit))) {
    free_cached_locked(p);
  }
  if (!over_limit(p, nbytes)) {
    return;
  }
  if (!p.cached.empty()) {
    p.stats.num_alloc_retries += 1;
    free_cached_locked(p);
  }
  if (over_limit(p, nbytes) && !on_stream_worker()) {
    // Let deferred frees complete, as CUDA synchronizes before its last retry.
    lock.unlock();
    synchronize_device(device);
    lock.lock();
    p.stats.num_sync_all_streams += 1;
    reclaim_locked(p);
    free_cached_locked(p);
  }
  if (over_limit(p, nbytes)) {
    raise_oom(p, device, nbytes, "");
  }
}

// Accounts a block handed to a caller (lock held).
void account_allocated_locked(DevicePool& p, Block* b, size_t requested, bool was_active) {
  b->allocated = true;
  b->requested = requested;
  update(p.stats.allocation, b->size, 1);
  update(p.stats.allocated_bytes, b->size, static_cast<int64_t>(b->size));
  update(p.stats.requested_bytes, b->size, static_cast<int64_t>(requested));
  if (!was_active) {
    update(p.stats.active, b->size, 1);
    update(p.stats.active_bytes, b->size, static_cast<int64_t>(b->size));
  }
  if (is_oversize(b->size)) {
    p.stats.oversize_allocations.increase(1);
  }
  trace_locked(p, "alloc", *b);
}


// Reports an allocation or free to torch.profiler and the sanitizer. Called
// without the pool lock: the sanitizer's observer takes the GIL, and a thread
// holding the GIL may be waiting for the pool lock (a deadlock seen in FSDP2).
void report_memory(DevicePool& p, void* ptr, int64_t delta, c10::DeviceIndex device,
    std::unique_lock<std::mutex>& lock) {
  const int64_t allocated = p.stats.allocated_bytes[0].current;
  const int64_t reserved = reserved_of(p);
  lock.unlock();
  note_memory(ptr, delta, allocated, reserved, device);
}

// A new segment joins the pool (lock held).
void account_segment_locked(DevicePool& p, Block* b) {
  update(p.stats.segment, b->size, 1);
  update(p.stats.reserved_bytes, b->size, static_cast<int64_t>(b->size));
  if (is_oversize(b->size)) {
    p.stats.oversize_segments.increase(1);
  }
  p.stats.num_device_alloc += 1;
  p.blocks.emplace(b->ptr, b);
  trace_locked(p, "segment_alloc", *b);
}


// Frees allocation `b` of pool `p` (locked by `lock`); `fences` are the
// streams with unfinished work at the time of the free.
void free_locked(DevicePool& p, Block* b, std::vector<Fence> fences, std::unique_lock<std::mutex>& lock) {
  for (c10::StreamId id : b->recorded) {
    const NpuStream& s = stream_for(b->device, id);
    const uint64_t enqueued = s.enqueued();
    if (s.completed() < enqueued) {
      fences.emplace_back(s.completed_counter(), enqueued);
    }
  }
  b->allocated = false;
  update(p.stats.allocation, b->size, -1);
  update(p.stats.allocated_bytes, b->size, -static_cast<int64_t>(b->size));
  update(p.stats.requested_bytes, b->size, -static_cast<int64_t>(b->requested));
  trace_locked(p, "free_requested", *b);
  void* const ptr = b->ptr;  // b may be released below
  const int64_t size = static_cast<int64_t>(b->size);
  const c10::DeviceIndex device = b->device;
  if (fences.empty()) {
    finish_free_locked(p, b);
  } else {
    p.pending.push_back(PendingFree{b, std::move(fences), stream_for(b->device, b->stream).completed_counter()});
    g_pending_count.fetch_add(1);
  }
  report_memory(p, ptr, -size, device, lock);
}

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  auto fences = pending_stream_fences();
  DevicePool& p = g_pools[b->device];
  std::unique_lock<std::mutex> lock(p.mutex);
  free_locked(p, b, std::move(fences), lock);
}



// A c10::DeviceAllocator so that torch.accelerator's memory functions work.
class DeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    if (C10_UNLIKELY(g_routed_streams.load(std::memory_order_acquire) != 0)) {
      // A private pool takes the allocations of its stream (an npu graph's capture).
      const NpuStream& stream = current_stream(device);
      if (PrivatePool* pool = g_routes[device * kStreamsPerDevice + stream.id()].load(std::memory_order_acquire)) {
        return pool->allocate(device, nbytes);
      }
    }
    return allocate_device(device, nbytes);
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



DevicePool& pool(c10::DeviceIndex device, const char* op) {
  check_device_index(device, op);
  // The streams' completion hook releases this allocator's deferred frees;
  // installed with the first use of a pool, before any free can be deferred.
  static const bool hooked = (add_completion_hook(&maybe_reclaim_deferred_frees), true);
  (void)hooked;
  return g_pools[device];
}

}  // namespace

void maybe_reclaim_deferred_frees() {
  if (g_pending_count.load(std::memory_order_acquire) > 0) {
    reclaim_deferred_frees();
  }
}

c10::Allocator* device_allocator() {
  static DeviceAllocator allocator;
  return &allocator;
}


c10::DataPtr allocate_device(c10::DeviceIndex device, size_t nbytes) {
  DevicePool& p = pool(device, "npu allocate");
  start_runtime();
  maybe_reclaim_deferred_frees();
  const c10::Device dev(c10::DeviceType::PrivateUse1, device);
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, dev);
  }
  const size_t size = round_size(nbytes);
  const c10::StreamId stream = current_stream(device).id();
  std::unique_lock<std::mutex> lock(p.mutex);
  bool was_active = false;
  Block* b = take_reusable_locked(p, stream, size, &was_active);
  if (b == nullptr) {
    make_room(lock, p, device, size);
    void* ptr = raw_alloc(size);
    if (ptr == nullptr && !p.cached.empty()) {
      p.stats.num_alloc_retries += 1;
      free_cached_locked(p);
      ptr = raw_alloc(size);
    }
    if (ptr == nullptr) {
      raise_oom(p, device, nbytes, "the host could not provide it.");
    }
    b = new Block();
    b->ptr = ptr;
    b->size = size;
    b->device = device;
    b->stream = stream;
    account_segment_locked(p, b);
  }
  account_allocated_locked(p, b, nbytes, was_active);
  report_memory(p, b->ptr, static_cast<int64_t>(b->size), device, lock);
  return c10::DataPtr(b->ptr, b, &free_block, dev);
}



c10::DataPtr adopt_as_device(c10::DataPtr&& cpu, size_t nbytes, c10::DeviceIndex device) {
  DevicePool& p = pool(device, "npu adopt");
  void* ptr = cpu.get();
  const c10::StreamId stream = current_stream(device).id();
  std::unique_lock<std::mutex> lock(p.mutex);
  make_room(lock, p, device, nbytes);  // on failure `cpu` frees the memory
  auto* b = new Block();
  b->ptr = ptr;
  b->size = nbytes;
  b->device = device;
  b->stream = stream;
  b->adopted = std::move(cpu);
  account_segment_locked(p, b);
  account_allocated_locked(p, b, nbytes, false);
  report_memory(p, ptr, static_cast<int64_t>(b->size), device, lock);
  return c10::DataPtr(ptr, b, &free_block, c10::Device(c10::DeviceType::PrivateUse1, device));
}


int64_t reclaim_deferred_frees() {
  int64_t moved = 0;
  for (int d = 0; d < device_count(); ++d) {
    DevicePool& p = g_pools[d];
    std::lock_guard<std::mutex> lock(p.mutex);
    if (!p.pending.empty()) {
      moved += reclaim_locked(p);
    }
  }
  return moved;
}

bool is_lent_block(c10::DeviceIndex device, const void* ptr) {
  DevicePool& p = g_pools[device];
  std::lock_guard<std::mutex> lock(p.mutex);
  auto it = p.blocks.find(ptr);
  return it != p.blocks.end() && it->second->allocated && !it->second->adopted;
}

void free_block_at(c10::DeviceIndex device, void* ptr) {
  auto fences = pending_stream_fences();
  DevicePool& p = g_pools[device];
  std::unique_lock<std::mutex> lock(p.mutex);
  Block* b = p.blocks.at(ptr);
  free_locked(p, b, std::move(fences), lock);
}

c10::DataPtr claim_block(c10::DeviceIndex device, void* ptr) {
  Block* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_pools[device].mutex);
    b = g_pools[device].blocks.at(ptr);
  }
  return c10::DataPtr(ptr, b, &free_block, c10::Device(c10::DeviceType::PrivateUse1, device));
}

void begin_allocate_to_pool(const NpuStream& stream, PrivatePool* pool) {
  auto& route = g_routes[stream.device() * kStreamsPerDevice + stream.id()];
  if (route.exchange(pool, std::memory_order_acq_rel) == nullptr) {
    g_routed_streams.fetch_add(1, std::memory_order_acq_rel);
  }
}

void end_allocate_to_pool(const NpuStream& stream) {
  auto& route = g_routes[stream.device() * kStreamsPerDevice + stream.id()];
  if (route.exchange(nullptr, std::memory_order_acq_rel) != nullptr) {
    g_routed_streams.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void empty_cache() {
  reclaim_deferred_frees();
  for (int d = 0; d < device_count(); ++d) {
    DevicePool& p = g_pools[d];
    std::lock_guard<std::mutex> lock(p.mutex);
    free_cached_locked(p);
  }
}

void reset_peak_stats(c10::DeviceIndex device) {
  DevicePool& p = pool(device, "reset_peak_memory_stats");
  std::lock_guard<std::mutex> lock(p.mutex);
  auto& s = p.stats;
  for (StatArray* array : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
           &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (auto& stat : *array) {
      stat.reset_peak();
    }
  }
  s.oversize_allocations.reset_peak();
  s.oversize_segments.reset_peak();
}

void reset_accumulated_stats(c10::DeviceIndex device) {
  DevicePool& p = pool(device, "reset_accumulated_memory_stats");
  std::lock_guard<std::mutex> lock(p.mutex);
  auto& s = p.stats;
  for (StatArray* array : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
           &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (auto& stat : *array) {
      stat.reset_accumulated();
    }
  }
  s.oversize_allocations.reset_accumulated();
  s.oversize_segments.reset_accumulated();
  s.num_alloc_retries = 0;
  s.num_ooms = 0;
  s.num_sync_all_streams = 0;
  s.num_device_alloc = 0;
  s.num_device_free = 0;
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
  DevicePool& p = g_pools[b->device];
  std::lock_guard<std::mutex> lock(p.mutex);
  if (stream.id() != b->stream &&
      std::find(b->recorded.begin(), b->recorded.end(), stream.id()) == b->recorded.end()) {
    b->recorded.push_back(stream.id());
  }
}

c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex device) {
  DevicePool& p = pool(device, "memory_stats");
  std::lock_guard<std::mutex> lock(p.mutex);
  auto out = p.stats;
  out.max_split_size = static_cast<int64_t>(g_settings.max_split_size);
  return out;
}

int64_t memory_capacity(c10::DeviceIndex device) {
  return pool(device, "memory capacity").capacity.load();
}

void set_memory_capacity(c10::DeviceIndex device, int64_t bytes) {
  pool(device, "set_memory_capacity").capacity = bytes < 0 ? -1 : bytes;
}

double memory_fraction(c10::DeviceIndex device) {
  return pool(device, "get_per_process_memory_fraction").fraction.load();
}

void set_memory_fraction(c10::DeviceIndex device, double fraction) {
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "set_per_process_memory_fraction: invalid fraction ", fraction,
      "; expected a number in [0, 1]");
  pool(device, "set_per_process_memory_fraction").fraction = fraction;
}

std::pair<size_t, size_t> memory_info(c10::DeviceIndex device) {
  DevicePool& p = pool(device, "mem_get_info");
  const int64_t cap = p.capacity.load();
  if (cap < 0) {
    return {0, 0};
  }
  std::lock_guard<std::mutex> lock(p.mutex);
  return {static_cast<size_t>(std::max<int64_t>(0, cap - reserved_of(p))), static_cast<size_t>(cap)};
}

void set_allocator_settings(const AllocatorSettings& settings) {
  std::lock_guard<std::mutex> lock(g_settings_mutex);
  g_settings = settings;
}

AllocatorSettings allocator_settings() {
  std::lock_guard<std::mutex> lock(g_settings_mutex);
  return g_settings;
}

std::vector<SegmentSnapshot> memory_snapshot() {
  std::vector<SegmentSnapshot> out;
  for (int d = 0; d < device_count(); ++d) {
    DevicePool& p = g_pools[d];
    std::lock_guard<std::mutex> lock(p.mutex);
    std::unordered_set<const Block*> pending;
    for (const auto& free : p.pending) {
      pending.insert(free.block);
    }
    for (const auto& [address, b] : p.blocks) {
      SegmentSnapshot s;
      s.device = static_cast<c10::DeviceIndex>(d);
      s.address = reinterpret_cast<uintptr_t>(b->ptr);
      s.total_size = b->size;
      s.stream = b->stream;
      s.is_large = b->size >= kSmallSize;
      s.adopted = static_cast<bool>(b->adopted);
      s.block.address = s.address;
      s.block.size = b->size;
      s.block.requested_size = b->allocated ? b->requested : 0;
      s.block.state = b->allocated ? "active_allocated" : (pending.count(b) ? "active_pending_free" : "inactive");
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(), [](const SegmentSnapshot& a, const SegmentSnapshot& b) {
    return std::make_pair(a.device, a.address) < std::make_pair(b.device, b.address);
  });
  return out;
}

void record_memory_history(bool enabled, size_t max_entries) {
  g_trace_max = max_entries;
  g_trace_enabled = enabled;
  for (auto& p : g_pools) {
    std::lock_guard<std::mutex> lock(p.mutex);
    if (!enabled) {
      p.trace.clear();
    }
  }
}

std::vector<TraceEntry> memory_trace(c10::DeviceIndex device) {
  DevicePool& p = pool(device, "memory trace");
  std::lock_guard<std::mutex> lock(p.mutex);
  return {p.trace.begin(), p.trace.end()};
}


}  // namespace npusim
