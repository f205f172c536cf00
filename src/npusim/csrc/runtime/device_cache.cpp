// One device's caching allocator: CUDA's CUDACachingAllocator over host
// memory (blocks, segments, best fit, splitting, coalescing, per-stream
// reuse, garbage collection, the retry ladder before OutOfMemoryError).
#include "device_cache.h"

#include "chip_clock.h"
#include "host_memory.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <sstream>

namespace npusim {

// Note [Caching allocator]
// CUDA's caching allocator (c10/cuda/CUDACachingAllocator.cpp), over host
// memory. Requests are rounded up to 512 bytes (or to a power-of-two
// division, roundup_power2_divisions). Requests up to 1 MiB come from the
// small pool, whose segments are 2 MiB; larger ones from the large pool,
// whose segments are 20 MiB (large_segment_size_mb) for requests under
// 10 MiB and the request rounded up to 2 MiB from there on. A free block is
// found by best fit among the free blocks of the request's pool and stream
// (a block is only reused for allocations on the stream its segment was
// allocated for); what the request leaves of it is split off as a free
// block when it is more than 512 bytes in the small pool and more than
// 1 MiB in the large pool (so a 33 MiB tensor holds the whole 34 MiB
// segment: memory_allocated() says 34 MiB, as on CUDA and torch_npu). A
// freed block merges with its free neighbours of the segment; a segment
// whose blocks are all free is one free block, and only such a block can go
// back to the host. Blocks of max_split_size_mb or more are "oversize": never
// split, handed only to requests of at least max_split_size (and at most
// max_non_split_rounding_mb smaller than the block), counted in
// oversize_allocations / oversize_segments. When no free block fits, a new
// segment is mapped, after garbage collection when
// garbage_collection_threshold is set (free unsplit large blocks that have
// waited longest, above the average age first, until reserved memory is
// back under the threshold's share of the device's limit). A segment that
// the device's limit (capacity x per-process fraction) or the host (Note
// [Host memory behind the device]) cannot take makes the allocator release
// oversize cached blocks (with max_split_size set), then wait for the
// device's streams, release every free segment and retry once
// (num_alloc_retries, num_sync_all_streams); then OutOfMemoryError
// (num_ooms), naming the host when it was the host that ran out. Statistics
// are CUDA's, per small / large pool: allocation, allocated_bytes and
// requested_bytes per allocation, active / active_bytes until a deferred
// free completes, segment / reserved_bytes per segment, inactive_split(_bytes)
// for free blocks of segments in use. Memory that a CPU kernel allocated
// outside the caching allocator (see Note [CPU kernels allocate device
// memory]) is adopted: a segment of one block, accounted, never cached, since
// the CPU allocator owns it. Private pools (npu graphs, MemPool) are
// private_pools.cpp's. The bookkeeping is CUDA's too (per pool, a set of free
// blocks ordered by stream, size and address), with one saving: a free block
// whose range changes in a split or a merge keeps its place in the set when
// the order allows, so the steady alloc / free cycle of one size (an op's
// output, again and again) does no tree work (BlockPool::rekey).

std::atomic<size_t> g_pending_frees{0};
std::atomic<bool> g_trace_enabled{false};
std::atomic<size_t> g_trace_max{0};

namespace {

// Replaced whole on every change and never freed (changes are rare), so that
// a reader needs one load and no lock.
std::atomic<const AllocatorSettings*> g_settings{new AllocatorSettings()};
std::mutex& g_settings_write_mutex = *new std::mutex();

// The aggregate and the block's pool type; several per allocation and free,
// so inlined and written out.
C10_ALWAYS_INLINE void stat_up(StatArray& stat, bool small, size_t amount) {
  stat[0].increase(amount);
  stat[small ? 1 : 2].increase(amount);
}

C10_ALWAYS_INLINE void stat_down(StatArray& stat, bool small, size_t amount) {
  stat[0].decrease(amount);
  stat[small ? 1 : 2].decrease(amount);
}

// A net change of either sign (the inactive_split figures of a free).
C10_ALWAYS_INLINE void update_stat(StatArray& stat, bool small, int64_t amount) {
  if (amount > 0) {
    stat_up(stat, small, static_cast<size_t>(amount));
  } else if (amount < 0) {
    stat_down(stat, small, static_cast<size_t>(-amount));
  }
}

size_t roundup_power2_next_division(size_t size, size_t divisions) {
  if ((size & (size - 1)) == 0) {
    return size;
  }
  const size_t floor2 = size_t{1} << (63 - __builtin_clzll(size));
  const size_t step = floor2 >> (63 - __builtin_clzll(divisions));
  if (step == 0) {
    return floor2 << 1;
  }
  const size_t down = size & ~(step - 1);
  return down == size ? size : down + step;
}

// The segment a rounded request is carved from.
size_t allocation_size(size_t size) {
  if (size <= kSmallSize) {
    return kSmallBuffer;
  }
  if (size < kMinLargeAlloc) {
    return settings().large_segment_size;
  }
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

// Waits, without raising their errors, until the device's streams have
// done what is enqueued on them (CUDA's synchronize_and_free_events). False
// on a stream worker, which must not wait for its own stream.
bool wait_for_device_streams(c10::DeviceIndex device) {
  if (on_stream_worker()) {
    return false;
  }
  for (c10::StreamId id = 0; id < kStreamsPerDevice; ++id) {
    NpuStream& s = stream_for(device, id);
    s.wait_completed(s.enqueued(), -1.0);
  }
  return true;
}

}  // namespace

const AllocatorSettings& settings() {
  return *g_settings.load(std::memory_order_acquire);
}

void set_allocator_settings(const AllocatorSettings& s) {
  std::lock_guard<std::mutex> lock(g_settings_write_mutex);
  g_settings.store(new AllocatorSettings(s), std::memory_order_release);
}

AllocatorSettings allocator_settings() {
  return settings();
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch()).count();
}

size_t round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) {
    return kMinBlockSize;
  }
  const size_t log2 = 63 - __builtin_clzll(nbytes);
  const size_t interval = std::min<size_t>(log2 > 20 ? log2 - 20 : 0, kRoundupIntervals - 1);
  const size_t divisions = settings().roundup_power2_divisions[interval];
  if (divisions > 1 && nbytes > kMinBlockSize * divisions) {
    return roundup_power2_next_division(nbytes, divisions);
  }
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

// ---- BlockPool --------------------------------------------------------------------

void BlockPool::insert(Block* b) {
  if (spare.empty()) {
    b->where = blocks.insert(b).first;
  } else {
    FreeBlocks::node_type node = std::move(spare.back());
    spare.pop_back();
    node.value() = b;
    b->where = blocks.insert(std::move(node)).position;
  }
  b->listed = true;
}

void BlockPool::erase(Block* b) {
  constexpr size_t kSpareNodes = 64;
  if (spare.size() < kSpareNodes) {
    spare.push_back(blocks.extract(b->where));
  } else {
    blocks.erase(b->where);
  }
  b->listed = false;
}

void BlockPool::rekey(Block* b, void* ptr, size_t size) {
  b->ptr = ptr;
  b->size = size;
  const BlockOrder less;
  const auto it = b->where;
  const auto after = std::next(it);
  if ((it == blocks.begin() || less(*std::prev(it), b)) && (after == blocks.end() || less(b, *after))) {
    return;  // still in order where it is
  }
  FreeBlocks::node_type node = blocks.extract(it);
  b->where = blocks.insert(std::move(node)).position;
}

// ---- blocks ------------------------------------------------------------------------

Block* DeviceCache::new_block() {
  if (spare_blocks_.empty()) {
    return new Block();
  }
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  return b;
}

void DeviceCache::delete_block(Block* b) {
  constexpr size_t kSpareBlocks = 256;
  if (spare_blocks_.size() >= kSpareBlocks) {
    delete b;
    return;
  }
  // A block is deleted free (its recorded streams cleared) or released
  // (its adopted memory gone): only the plain fields need resetting.
  b->prev = b->next = nullptr;
  b->allocated = b->pending = b->listed = false;
  b->own_fence = 0;
  spare_blocks_.push_back(b);
}

int64_t DeviceCache::limit() const {
  const int64_t cap = capacity.load();
  return cap < 0 ? -1 : static_cast<int64_t>(static_cast<double>(cap) * fraction.load());
}

void DeviceCache::record_trace_locked(const char* action, uintptr_t address, size_t size, c10::StreamId stream) {
  if (!g_trace_enabled.load(std::memory_order_relaxed)) {
    return;
  }
  trace.push_back(TraceEntry{action, address, size, stream, now_us()});
  while (trace.size() > g_trace_max.load()) {
    trace.pop_front();
  }
}

BlockPool& DeviceCache::pool_for_locked(size_t size, c10::StreamId stream) {
  if (C10_UNLIKELY(!scopes_.empty())) {
    const std::thread::id thread = std::this_thread::get_id();
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (it->stream >= 0 ? it->stream == stream : it->thread == thread) {
        PrivatePool* pp = private_pool_locked(it->pool);
        return size <= kSmallSize ? pp->small : pp->large;
      }
    }
  }
  return size <= kSmallSize ? small_ : large_;
}

Block* DeviceCache::get_free_block_locked(BlockPool& pool, c10::StreamId stream, size_t size) {
  const AllocatorSettings& s = settings();
  ++pool.searches;
  auto it = pool.blocks.lower_bound(BlockKey{stream, size});
  if (it == pool.blocks.end() || (*it)->stream != stream) {
    return nullptr;
  }
  Block* b = *it;
  // An oversize block serves only a request that is itself oversize, and
  // one that would not waste more than max_non_split_rounding of it.
  if (size < s.max_split_size && b->size >= s.max_split_size) {
    return nullptr;
  }
  if (size >= s.max_split_size && b->size >= size + s.max_non_split_rounding) {
    return nullptr;
  }
  return b;  // still listed: hand_out_locked takes it out, or leaves its rest in place
}

Block* DeviceCache::hand_out_locked(BlockPool& pool, Block* b, size_t size, size_t requested, bool exact) {
  const AllocatorSettings& s = settings();
  const bool small = pool.is_small;
  const bool already_split = b->is_split();
  const size_t remaining_size = b->size - size;
  const bool split = exact ? remaining_size > 0 : !(pool.owner != nullptr && pool.owner->no_split) &&
      (small ? remaining_size >= kMinBlockSize : size < s.max_split_size && remaining_size > kSmallSize);
  if (split) {
    Block* remaining = b;
    b = new_block();
    b->ptr = remaining->ptr;
    b->size = size;
    b->device = device;
    b->stream = remaining->stream;
    b->pool = &pool;
    b->own_fence = remaining->own_fence;
    b->unfinished = remaining->unfinished;
    b->prev = remaining->prev;
    if (b->prev != nullptr) {
      b->prev->next = b;
    }
    b->next = remaining;
    remaining->prev = b;
    if (remaining->listed) {
      pool.rekey(remaining, static_cast<char*>(remaining->ptr) + size, remaining_size);
    } else {
      remaining->ptr = static_cast<char*>(remaining->ptr) + size;
      remaining->size = remaining_size;
      pool.insert(remaining);
    }
    if (already_split) {
      stat_down(stats.inactive_split_bytes, small, size);
    } else {
      stat_up(stats.inactive_split_bytes, small, remaining->size);
      stat_up(stats.inactive_split, small, 1);
    }
  } else {
    if (b->listed) {
      pool.erase(b);
    }
    if (already_split) {
      stat_down(stats.inactive_split_bytes, small, b->size);
      stat_down(stats.inactive_split, small, 1);
    }
  }
  b->allocated = true;
  b->requested = requested;
  allocated_.emplace(b->ptr, b);
  stat_up(stats.allocation, small, 1);
  stat_up(stats.allocated_bytes, small, b->size);
  stat_up(stats.active, small, 1);
  stat_up(stats.active_bytes, small, b->size);
  stat_up(stats.requested_bytes, small, requested);
  if (b->size >= s.max_split_size) {
    stats.oversize_allocations.increase(1);
  }
  record_trace_locked("alloc", reinterpret_cast<uintptr_t>(b->ptr), requested, b->stream);
  return b;
}

// ---- segments ----------------------------------------------------------------------

Block* DeviceCache::map_segment_locked(BlockPool& pool, c10::StreamId stream, size_t size, bool retry,
    std::string* why) {
  if (retry) {
    stats.num_alloc_retries += 1;
  }
  const int64_t cap = limit();
  if (cap >= 0 && reserved() + static_cast<int64_t>(size) > cap) {
    why->clear();  // the device's limit
    return nullptr;
  }
  const HostHeadroom host = host_headroom(size);
  void* ptr = host.fits ? map_segment(size) : nullptr;
  if (ptr == nullptr) {
    std::ostringstream msg;
    msg << "the host ran out of memory, not the simulated device: ";
    if (host.fits) {
      msg << "mapping " << format_bytes(static_cast<int64_t>(size)) << " of host memory failed";
    } else {
      msg << "the host has " << format_bytes(host.available) << " available and npusim leaves it at least "
          << format_bytes(host.margin) << " (NPUSIM_HOST_MEMORY_MARGIN)";
    }
    *why = msg.str();
    return nullptr;
  }
  Block* b = new_block();
  b->ptr = ptr;
  b->size = size;
  b->device = device;
  b->stream = stream;
  b->pool = &pool;
  if (pool.owner != nullptr) {
    pool.owner->segments += 1;
  }
  stat_up(stats.segment, pool.is_small, 1);
  stat_up(stats.reserved_bytes, pool.is_small, size);
  if (size >= settings().max_split_size) {
    stats.oversize_segments.increase(1);
  }
  stats.num_device_alloc += 1;
  record_trace_locked("segment_alloc", reinterpret_cast<uintptr_t>(ptr), size, stream);
  return b;
}

bool DeviceCache::releasable(const Block* b) const {
  return b->listed && !b->is_split() && stream_for(device, b->stream).completed() >= b->own_fence &&
      fences_passed(b->unfinished);
}

void DeviceCache::release_segment_locked(Block* b) {
  BlockPool& pool = *b->pool;
  stats.num_device_free += 1;
  record_trace_locked("segment_free", reinterpret_cast<uintptr_t>(b->ptr), b->size, b->stream);
  if (b->adopted) {
    b->adopted.clear();  // the CPU allocator's memory goes back through its own deleter
  } else {
    pool.erase(b);
    unmap_segment(b->ptr, b->size);
  }
  if (pool.owner != nullptr) {
    pool.owner->segments -= 1;
  }
  stat_down(stats.segment, pool.is_small, 1);
  stat_down(stats.reserved_bytes, pool.is_small, b->size);
  if (b->size >= settings().max_split_size) {
    stats.oversize_segments.decrease(1);
  }
  delete_block(b);
}

void DeviceCache::release_pool_blocks_locked(BlockPool& pool) {
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* b = *it++;
    if (releasable(b)) {
      release_segment_locked(b);
    }
  }
}

void DeviceCache::release_cached_blocks_locked(bool private_pools_too) {
  reclaim_locked();
  release_pool_blocks_locked(large_);
  release_pool_blocks_locked(small_);
  if (!private_pools_too) {
    return;  // a replay may still run on their memory unless the streams were waited for
  }
  for (auto it = private_pools_.begin(); it != private_pools_.end();) {
    PrivatePool& pp = *it->second;
    if (pp.use_count > 0) {
      ++it;
      continue;
    }
    release_pool_blocks_locked(pp.small);
    release_pool_blocks_locked(pp.large);
    it = pp.segments == 0 ? private_pools_.erase(it) : std::next(it);
  }
}

bool DeviceCache::release_available_cached_blocks_locked(BlockPool& pool, c10::StreamId stream, size_t size) {
  const size_t max_split = settings().max_split_size;
  if (max_split == SIZE_MAX) {
    return false;
  }
  // One oversize block of the stream big enough, else the biggest ones until enough.
  const BlockKey key{stream, std::max(size, max_split)};
  auto it = pool.blocks.lower_bound(key);
  if (it != pool.blocks.end() && (*it)->stream == stream && releasable(*it)) {
    release_segment_locked(*it);
    return true;
  }
  std::vector<Block*> victims;
  size_t released = 0;
  while (it != pool.blocks.begin() && released < key.size) {
    Block* b = *--it;
    if (b->stream != stream || b->size < max_split) {
      break;
    }
    if (releasable(b)) {
      victims.push_back(b);
      released += b->size;
    }
  }
  if (released < key.size) {
    return false;
  }
  for (Block* b : victims) {
    release_segment_locked(b);
  }
  return true;
}

void DeviceCache::garbage_collect_locked() {
  const double threshold_fraction = settings().garbage_collection_threshold;
  const int64_t cap = limit();
  if (threshold_fraction <= 0.0 || cap < 0) {
    return;
  }
  const auto threshold = static_cast<int64_t>(threshold_fraction * static_cast<double>(cap));
  if (reserved() <= threshold) {
    return;
  }
  const int64_t target = reserved() - threshold;
  std::vector<Block*> candidates;
  double total_age = 0.0;
  for (Block* b : large_.blocks) {
    if (releasable(b)) {
      candidates.push_back(b);
      total_age += static_cast<double>(large_.searches - b->free_since);
    }
  }
  // CUDA's order: blocks older than the average first, again until enough.
  int64_t reclaimed = 0;
  bool freed = true;
  while (reclaimed < target && freed && !candidates.empty()) {
    const double average = total_age / static_cast<double>(candidates.size());
    freed = false;
    for (auto it = candidates.begin(); it != candidates.end();) {
      const auto age = static_cast<double>(large_.searches - (*it)->free_since);
      if (age < average) {
        ++it;
        continue;
      }
      reclaimed += static_cast<int64_t>((*it)->size);
      total_age -= age;
      release_segment_locked(*it);
      it = candidates.erase(it);
      freed = true;
    }
  }
}

// ---- allocation --------------------------------------------------------------------

Block* DeviceCache::malloc_locked(size_t nbytes, c10::StreamId stream, std::unique_lock<std::mutex>& lock) {
  const size_t size = round_size(nbytes);
  BlockPool& pool = pool_for_locked(size, stream);
  if (Block* b = get_free_block_locked(pool, stream, size)) {
    return hand_out_locked(pool, b, size, nbytes);
  }
  if (Block* b = wait_for_deferred_frees_locked(pool, stream, size, lock)) {
    return hand_out_locked(pool, b, size, nbytes);
  }
  const size_t alloc_size = allocation_size(size);
  std::string why;
  garbage_collect_locked();
  Block* b = map_segment_locked(pool, stream, alloc_size, false, &why);
  if (b == nullptr && pool.owner == nullptr) {
    b = from_use_on_oom_pools_locked(stream, size);
  }
  if (b == nullptr && release_available_cached_blocks_locked(pool, stream, size)) {
    b = map_segment_locked(pool, stream, alloc_size, false, &why);
  }
  if (b == nullptr) {
    // Let deferred frees complete and give every free segment back, then
    // retry once (CUDA synchronizes before its last retry).
    empty_cache_locked(lock, /*synchronize=*/true);
    b = get_free_block_locked(pool, stream, size);
    if (b == nullptr) {
      b = map_segment_locked(pool, stream, alloc_size, true, &why);
    }
  }
  if (b == nullptr) {
    raise_oom_locked(nbytes, alloc_size, why);
  }
  return hand_out_locked(*b->pool, b, size, nbytes);
}

// Note [Bounded deferred frees]
// A deferred free (Tensor.record_stream's, or a block an allocation could not
// wait for: Note [Stream-ordered free]) keeps its block out of the cache
// until that work is done. With compute on the
// streams, a host thread launching ops on one stream while another stream is
// busy runs ahead of both, and every block it frees is deferred: the cache
// would map a segment per step until the host stops (PyTorch's conv2d from
// two threads, each on its own stream, reserved 200 MiB for 3 MiB allocated
// in 200 steps, growing with the steps). CUDA's host is held back by its
// launch queue; npusim's is held back by its memory instead: when a request
// finds no free block while the deferred frees hold at least
// kDeferredFreeFloor and more than the device has allocated, the allocation
// waits for the oldest deferred frees' fences (the work that was pending when
// they were freed, already enqueued, so the wait needs no host action) and
// takes a block that became free, before mapping a new segment. Each wait is
// bounded (kDeferredFreeWait): a stream stuck behind work that needs this
// host (a collective whose peer waits on it) makes the allocation map a
// segment as before rather than deadlock. A stream worker never waits.

namespace {

constexpr int64_t kDeferredFreeFloor = 20 << 20;
constexpr auto kDeferredFreeWait = std::chrono::milliseconds(500);

// Whether every fence passed before `deadline` (polling: fences are bare
// counters). Most waits are for a task or two: the first turns only yield.
bool wait_for_fences(const std::vector<Fence>& fences, std::chrono::steady_clock::time_point deadline) {
  int turn = 0;
  for (const Fence& f : fences) {
    while (!fence_passed(f)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return false;
      }
      if (++turn < 1024) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
  return true;
}

}  // namespace

bool DeviceCache::wait_for_unfinished(std::vector<Fence>& fences) {
  if (fences_passed(fences)) {
    return true;
  }
  return !on_stream_worker() && wait_for_fences(fences, std::chrono::steady_clock::now() + kDeferredFreeWait);
}

Block* DeviceCache::wait_for_deferred_frees_locked(BlockPool& pool, c10::StreamId stream, size_t size,
    std::unique_lock<std::mutex>& lock) {
  if (on_stream_worker()) {
    return nullptr;
  }
  while (!pending_.empty() && pending_bytes_ >= kDeferredFreeFloor &&
      pending_bytes_ > stats.allocated_bytes[0].current) {
    const std::vector<Fence> fences = pending_.front().fences;
    lock.unlock();
    const bool passed = wait_for_fences(fences, std::chrono::steady_clock::now() + kDeferredFreeWait);
    lock.lock();
    reclaim_locked();
    if (Block* b = get_free_block_locked(pool, stream, size)) {
      return b;
    }
    if (!passed) {
      return nullptr;
    }
  }
  return nullptr;
}

Block* DeviceCache::adopt_locked(c10::DataPtr&& cpu, size_t nbytes, c10::StreamId stream,
    std::unique_lock<std::mutex>& lock) {
  BlockPool& pool = nbytes <= kSmallSize ? small_ : large_;
  const int64_t cap = limit();
  if (cap >= 0 && reserved() + static_cast<int64_t>(nbytes) > cap) {
    empty_cache_locked(lock, /*synchronize=*/true);
    stats.num_alloc_retries += 1;
    if (reserved() + static_cast<int64_t>(nbytes) > cap) {
      raise_oom_locked(nbytes, nbytes, "");  // `cpu` frees the memory
    }
  }
  Block* b = new_block();
  b->ptr = cpu.get();
  b->size = nbytes;
  b->device = device;
  b->stream = stream;
  b->pool = &pool;
  b->adopted = std::move(cpu);
  stat_up(stats.segment, pool.is_small, 1);
  stat_up(stats.reserved_bytes, pool.is_small, nbytes);
  if (nbytes >= settings().max_split_size) {
    stats.oversize_segments.increase(1);
  }
  stats.num_device_alloc += 1;
  record_trace_locked("segment_alloc", reinterpret_cast<uintptr_t>(b->ptr), nbytes, stream);
  b->allocated = true;
  b->requested = nbytes;
  allocated_.emplace(b->ptr, b);
  stat_up(stats.allocation, pool.is_small, 1);
  stat_up(stats.allocated_bytes, pool.is_small, nbytes);
  stat_up(stats.active, pool.is_small, 1);
  stat_up(stats.active_bytes, pool.is_small, nbytes);
  stat_up(stats.requested_bytes, pool.is_small, nbytes);
  if (nbytes >= settings().max_split_size) {
    stats.oversize_allocations.increase(1);
  }
  record_trace_locked("alloc", reinterpret_cast<uintptr_t>(b->ptr), nbytes, stream);
  return b;
}

[[noreturn]] void DeviceCache::raise_oom_locked(size_t nbytes, size_t alloc_size, const std::string& why) {
  stats.num_ooms += 1;
  const int64_t cap = limit();
  const int64_t free_bytes = cap < 0 ? -1 : std::max<int64_t>(0, cap - reserved());
  record_trace_locked("oom", static_cast<uintptr_t>(std::max<int64_t>(0, free_bytes)), nbytes, 0);
  const int64_t allocated = stats.allocated_bytes[0].current;
  const int64_t total = capacity.load();
  const std::string free_text = cap < 0 ? std::string("unlimited") : format_bytes(free_bytes);
  // torch_npu's first sentence, which user code and torch_npu's tests match
  // ("NPU out of memory. Tried to allocate"), then npusim's detail.
  std::ostringstream msg;
  msg << "NPU out of memory. Tried to allocate " << format_bytes(static_cast<int64_t>(nbytes)) << " (NPU "
      << static_cast<int>(device) << "; " << (total < 0 ? std::string("unlimited") : format_bytes(total))
      << " total capacity; " << format_bytes(allocated) << " already allocated; "
      << format_bytes(stats.active_bytes[0].current) << " current active; " << free_text << " free; "
      << format_bytes(reserved()) << " reserved in total by PyTorch). On npu:" << static_cast<int>(device)
      << ", " << format_bytes(static_cast<int64_t>(nbytes)) << " (" << nbytes << " bytes";
  if (alloc_size != nbytes) {
    msg << ", a new segment of " << format_bytes(static_cast<int64_t>(alloc_size));
  }
  msg << "); ";
  if (!why.empty()) {
    msg << why << ". The simulated device has ";
  }
  msg << "capacity " << (total < 0 ? std::string("unlimited") : format_bytes(total));
  if (cap >= 0 && cap != total) {
    msg << ", of which this process may reserve " << format_bytes(cap) << " (per-process memory fraction "
        << fraction.load() << ")";
  }
  msg << ", " << format_bytes(allocated) << " allocated, " << format_bytes(reserved()) << " reserved, "
      << free_text << " free";
  if (cap >= 0) {
    msg << " (" << free_bytes << " bytes)";
  }
  msg << ".";
  if (why.empty() && reserved() - allocated > static_cast<int64_t>(alloc_size)) {
    msg << " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.";
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
}

// ---- free ----------------------------------------------------------------------------

void DeviceCache::free_locked(Block* b, std::vector<Fence> fences, bool reusable_now) {
  std::vector<Fence> recorded;  // Tensor.record_stream's streams: CUDA's own wait
  for (c10::StreamId id : b->recorded) {
    const NpuStream& s = stream_for(device, id);
    const uint64_t enqueued = s.enqueued();
    if (s.completed() < enqueued) {
      recorded.emplace_back(s.completed_counter(), enqueued);
    }
  }
  const AllocatorSettings& s = settings();
  const bool small = b->pool->is_small;
  b->allocated = false;
  allocated_.erase(b->ptr);
  stat_down(stats.allocation, small, 1);
  stat_down(stats.allocated_bytes, small, b->size);
  if (b->size >= s.max_split_size) {
    stats.oversize_allocations.decrease(1);
  }
  record_trace_locked("free_requested", reinterpret_cast<uintptr_t>(b->ptr), b->requested, b->stream);
  if (!b->adopted && !fences.empty()) {
    // Note [Stream-ordered free]: work of the block's own stream is ordered
    // before its pool's next user there; it only delays the host's release.
    const std::atomic<uint64_t>* own = stream_for(device, b->stream).completed_counter();
    auto kept = std::remove_if(fences.begin(), fences.end(), [&](const Fence& f) {
      if (f.first != own) {
        return false;
      }
      b->own_fence = std::max(b->own_fence, f.second);
      return true;
    });
    fences.erase(kept, fences.end());
  }
  if (recorded.empty() && !b->adopted && reusable_now && chip_clock_on()) {
    // Note [Stream-ordered free]: under the chip clock the block is free now,
    // as on CUDA; the other streams' work is waited for when it is handed out.
    b->unfinished = std::move(fences);
    return_to_pool_locked(b);
    return;
  }
  fences.insert(fences.end(), recorded.begin(), recorded.end());
  if (fences.empty()) {
    return_to_pool_locked(b);
    return;
  }
  b->pending = true;
  pending_.push_back(PendingFree{b, std::move(fences)});
  pending_bytes_ += static_cast<int64_t>(b->size);
  g_pending_frees.fetch_add(1);
}

void DeviceCache::return_to_pool_locked(Block* b) {
  BlockPool& pool = *b->pool;
  const bool small = pool.is_small;
  record_trace_locked("free_completed", reinterpret_cast<uintptr_t>(b->ptr), b->requested, b->stream);
  stat_down(stats.active, small, 1);
  stat_down(stats.active_bytes, small, b->size);
  stat_down(stats.requested_bytes, small, b->requested);
  if (!b->recorded.empty()) {
    b->recorded.clear();
  }
  if (b->adopted) {
    release_segment_locked(b);
    return;
  }
  // Coalescing: b and its free neighbours in the segment become one block.
  Block* const prev = b->prev != nullptr && b->prev->listed ? b->prev : nullptr;
  Block* const next = b->next != nullptr && b->next->listed ? b->next : nullptr;
  int64_t split_blocks = -static_cast<int64_t>(prev != nullptr) - static_cast<int64_t>(next != nullptr);
  int64_t split_bytes = -static_cast<int64_t>((prev != nullptr ? prev->size : 0) + (next != nullptr ? next->size : 0));
  Block* merged = b;
  if (prev == nullptr && next == nullptr) {
    pool.insert(b);
  } else {
    // A listed neighbour takes the whole range, keeping its place in the set
    // when the order allows (Note [Caching allocator]).
    merged = next != nullptr ? next : prev;
    Block* const first = prev != nullptr ? prev : b;
    Block* const last = next != nullptr ? next : b;
    void* const ptr = first->ptr;
    const size_t size = (prev != nullptr ? prev->size : 0) + b->size + (next != nullptr ? next->size : 0);
    Block* const before = first->prev;
    Block* const after = last->next;
    for (Block* n : {prev, b, next}) {
      if (n != nullptr && n != merged) {
        merged->own_fence = std::max(merged->own_fence, n->own_fence);
        merged->unfinished.insert(merged->unfinished.end(), n->unfinished.begin(), n->unfinished.end());
        fences_passed(merged->unfinished);  // keeps only the fences still to pass
        if (n->listed) {
          pool.erase(n);
        }
        delete_block(n);
      }
    }
    merged->prev = before;
    merged->next = after;
    if (before != nullptr) {
      before->next = merged;
    }
    if (after != nullptr) {
      after->prev = merged;
    }
    pool.rekey(merged, ptr, size);
  }
  if (merged->is_split()) {
    split_blocks += 1;
    split_bytes += static_cast<int64_t>(merged->size);
  }
  update_stat(stats.inactive_split, small, split_blocks);
  update_stat(stats.inactive_split_bytes, small, split_bytes);
  merged->free_since = pool.searches;
}

int64_t DeviceCache::reclaim_locked() {
  if (pending_.empty()) {
    return 0;
  }
  // stable_partition, not a hand-written compaction: a self-move of the
  // fences vector would empty it and release a block that is still in use.
  auto passed = std::stable_partition(pending_.begin(), pending_.end(), [](const PendingFree& p) {
    return !std::all_of(p.fences.begin(), p.fences.end(), fence_passed);
  });
  int64_t moved = 0;
  for (auto it = passed; it != pending_.end(); ++it) {
    moved += static_cast<int64_t>(it->block->size);
    it->block->pending = false;
    return_to_pool_locked(it->block);
  }
  pending_bytes_ -= moved;
  g_pending_frees.fetch_sub(static_cast<size_t>(std::distance(passed, pending_.end())));
  pending_.erase(passed, pending_.end());
  return moved;
}

void DeviceCache::empty_cache_locked(std::unique_lock<std::mutex>& lock, bool synchronize) {
  bool waited = false;
  if (synchronize) {
    lock.unlock();
    waited = wait_for_device_streams(device);
    lock.lock();
    if (waited) {
      stats.num_sync_all_streams += 1;
    }
  }
  release_cached_blocks_locked(waited);
}

void DeviceCache::record_stream_locked(Block* b, c10::StreamId stream) {
  if (stream != b->stream && std::find(b->recorded.begin(), b->recorded.end(), stream) == b->recorded.end()) {
    b->recorded.push_back(stream);
  }
}

}  // namespace npusim
