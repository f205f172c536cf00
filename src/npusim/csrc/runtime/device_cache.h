// The caching allocator of one device (device_cache.cpp, private_pools.cpp):
// CUDA's blocks, segments and pools over host memory. device_allocator.cpp is
// its face (c10::DeviceAllocator, the functions Python and the floors above
// call). See Note [Caching allocator] and Note [Stream-ordered free].
#pragma once

#include <optional>

#include "device_allocator.h"
#include "stream.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/flat_hash_map.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace npusim {

constexpr size_t kMinBlockSize = 512;         // every size is rounded to a multiple of it
constexpr size_t kSmallSize = 1 << 20;         // the largest request of the small pool
constexpr size_t kSmallBuffer = 2 << 20;       // the small pool's segments
constexpr size_t kMinLargeAlloc = 10 << 20;    // from here on a request gets a segment of its own
constexpr size_t kRoundLarge = 2 << 20;        // ... rounded up to 2 MiB
constexpr size_t kLargeBuffer = 20 << 20;      // the large pool's segments (large_segment_size_mb)

struct Block;
struct PrivatePool;

// What a request looks for: the first free block of `stream` of at least `size`.
struct BlockKey {
  c10::StreamId stream;
  size_t size;
};

// Best fit: free blocks ordered by stream, then size, then address.
struct BlockOrder {
  using is_transparent = void;
  bool operator()(const Block* a, const Block* b) const;
  bool operator()(const Block* a, const BlockKey& k) const;
  bool operator()(const BlockKey& k, const Block* b) const;
};
using FreeBlocks = std::set<Block*, BlockOrder>;

struct BlockPool;

// A block: a range of one segment, allocated or free. A segment is one host
// mapping; its blocks are linked by prev / next in address order.
struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  size_t requested = 0;          // what the allocation asked for (allocated blocks)
  c10::DeviceIndex device = 0;
  c10::StreamId stream = 0;      // the stream the segment was allocated for
  BlockPool* pool = nullptr;     // the pool of its segment
  Block* prev = nullptr;
  Block* next = nullptr;
  bool allocated = false;
  bool pending = false;          // freed, other streams may still use it (Note [Stream-ordered free])
  bool listed = false;           // among its pool's free blocks, at `where`
  FreeBlocks::iterator where;
  // The allocation stream's task count when the block was last freed: its
  // memory may go back to the host once the stream has completed that many.
  uint64_t own_fence = 0;
  uint64_t free_since = 0;       // the pool's search count when it became free (its age for GC)
  // Other streams' work pending when the block was freed: a free block may be
  // chosen at once, as on CUDA, but is handed out only once these have passed
  // (Note [Stream-ordered free]).
  mutable std::vector<Fence> unfinished;  // passed fences are dropped as they are checked
  std::vector<c10::StreamId> recorded;  // Tensor.record_stream, streams of the same device
  c10::DataPtr adopted;          // memory a CPU kernel allocated: a segment of one block, never cached

  bool is_split() const {
    return prev != nullptr || next != nullptr;
  }
};

inline bool BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) {
    return a->stream < b->stream;
  }
  if (a->size != b->size) {
    return a->size < b->size;
  }
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}
inline bool BlockOrder::operator()(const Block* a, const BlockKey& k) const {
  return a->stream != k.stream ? a->stream < k.stream : a->size < k.size;
}
inline bool BlockOrder::operator()(const BlockKey& k, const Block* b) const {
  return k.stream != b->stream ? k.stream < b->stream : k.size < b->size;
}

// The free blocks of one pool (small or large, of the device or of a private
// pool). A block's place in the set is kept with it, and a block whose key
// changes (a split or a merge) keeps its place when the order allows, so
// that the steady alloc / free cycle of one size does no tree work; set
// nodes are kept for reuse, so that bookkeeping allocates no host memory.
struct BlockPool {
  BlockPool(bool small, PrivatePool* private_pool) : is_small(small), owner(private_pool) {}

  void insert(Block* b);
  void erase(Block* b);
  // Gives listed block `b` the range (ptr, size), moving it in the set only
  // when its neighbours there are no longer in order.
  void rekey(Block* b, void* ptr, size_t size);

  FreeBlocks blocks;
  std::vector<FreeBlocks::node_type> spare;
  const bool is_small;
  PrivatePool* const owner;  // null: the device's own pools
  uint64_t searches = 0;     // get_free_block calls: the clock blocks age by
};

// A private pool (CUDA's PrivatePool): an npu graph's or a MemPool's.
struct PrivatePool {
  explicit PrivatePool(c10::MempoolId_t pool_id) : id(pool_id) {}
  PrivatePool(const PrivatePool&) = delete;
  PrivatePool& operator=(const PrivatePool&) = delete;

  const c10::MempoolId_t id;
  int use_count = 1;   // graphs, MemPools and allocation scopes holding the pool
  int segments = 0;    // its segments not yet released to the host
  bool no_split = false;
  bool use_on_oom = false;
  BlockPool small{true, this};
  BlockPool large{false, this};
};

// beginAllocateToPool: allocations on `stream` (or, when stream < 0, by
// `thread`) come from `pool`.
struct AllocationScope {
  c10::MempoolId_t pool;
  c10::StreamId stream = -1;
  std::thread::id thread;
};

struct PendingFree {
  Block* block;
  std::vector<Fence> fences;  // other streams' work at the time of the free
};

using StatArray = c10::CachingDeviceAllocator::StatArray;

// One device's allocator. Every member is guarded by `mutex` unless noted;
// methods ending in _locked expect it held.
class DeviceCache {
 public:
  DeviceCache() = default;
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;

  std::mutex mutex;
  c10::DeviceIndex device = 0;
  c10::CachingDeviceAllocator::DeviceStats stats;
  std::atomic<int64_t> capacity{-1};
  std::atomic<double> fraction{1.0};

  // A block of at least `nbytes` for `stream` (an allocation of the caller's);
  // may drop `lock` to synchronize the device; raises OutOfMemoryError.
  Block* malloc_locked(size_t nbytes, c10::StreamId stream, std::unique_lock<std::mutex>& lock);
  // Memory a CPU kernel produced, accounted as a segment of one block.
  Block* adopt_locked(c10::DataPtr&& cpu, size_t nbytes, c10::StreamId stream, std::unique_lock<std::mutex>& lock);
  // The caller's free of `b`; `fences`: the streams with unfinished work now.
  // `reusable_now` false: the block stays out of the pool until `fences` pass
  // (an allocation that could not wait for them: Note [Stream-ordered free]).
  void free_locked(Block* b, std::vector<Fence> fences, bool reusable_now = true);
  // Waits, at most kDeferredFreeWait and never on a stream worker, until a
  // handed-out block's unfinished fences pass; false if they did not.
  static bool wait_for_unfinished(std::vector<Fence>& fences);
  // Moves pending frees whose fences have passed into their pools; their bytes.
  int64_t reclaim_locked();
  bool has_pending() const {
    return !pending_.empty();
  }
  // empty_cache: every free segment of the device pools (and, once the
  // device's streams were waited for, of the private pools nobody holds) goes
  // back to the host.
  void empty_cache_locked(std::unique_lock<std::mutex>& lock, bool synchronize);
  void record_stream_locked(Block* b, c10::StreamId stream);
  int64_t reserved() const {
    return stats.reserved_bytes[0].current;
  }
  // capacity x fraction, -1: unlimited.
  int64_t limit() const;
  Block* allocated_block(const void* ptr) const {
    auto it = allocated_.find(ptr);
    return it == allocated_.end() ? nullptr : it->second;
  }
  std::vector<SegmentSnapshot> snapshot_locked(c10::MempoolId_t pool) const;
  std::deque<TraceEntry> trace;

  // ---- private pools (private_pools.cpp) ----
  void create_or_incref_pool_locked(c10::MempoolId_t id, bool no_split, bool use_on_oom);
  void begin_allocate_to_pool_locked(c10::MempoolId_t id, const AllocationScope& scope);
  // A stream joining a capture: its allocations go to the pool too (no new hold).
  void join_allocate_to_pool_locked(c10::MempoolId_t id, c10::StreamId stream);
  // Ends the scope of `stream` (or the first scope of the pool when none is named).
  void end_allocate_to_pool_locked(c10::MempoolId_t id, std::optional<c10::StreamId> stream = std::nullopt);
  void release_pool_locked(c10::MempoolId_t id);
  int pool_use_count_locked(c10::MempoolId_t id) const;
  std::vector<const void*> pool_live_allocations_locked(c10::MempoolId_t id) const;
  std::shared_ptr<PoolCheckpoint> checkpoint_pool_locked(c10::MempoolId_t id) const;
  // (the addresses it freed, the blocks it allocated)
  std::pair<std::vector<void*>, std::vector<Block*>> restore_pool_locked(const PoolCheckpoint& checkpoint);

 private:
  BlockPool& pool_for_locked(size_t size, c10::StreamId stream);
  Block* get_free_block_locked(BlockPool& pool, c10::StreamId stream, size_t size);
  Block* map_segment_locked(BlockPool& pool, c10::StreamId stream, size_t size, bool retry, std::string* why);
  Block* from_use_on_oom_pools_locked(c10::StreamId stream, size_t size);
  // Note [Bounded deferred frees]: waits for the oldest deferred frees while
  // they hold more than the device has allocated; a block for the request
  // that became free, or null.
  Block* wait_for_deferred_frees_locked(BlockPool& pool, c10::StreamId stream, size_t size,
      std::unique_lock<std::mutex>& lock);
  bool release_available_cached_blocks_locked(BlockPool& pool, c10::StreamId stream, size_t size);
  void release_cached_blocks_locked(bool private_pools_too);
  void release_pool_blocks_locked(BlockPool& pool);
  void garbage_collect_locked();
  void release_segment_locked(Block* b);
  bool releasable(const Block* b) const;
  // Allocates `size` of free block `b` of `pool` (listed there, or a fresh
  // segment), splitting off the rest when CUDA's rules say so (exact:
  // whenever there is a rest).
  Block* hand_out_locked(BlockPool& pool, Block* b, size_t size, size_t requested, bool exact = false);
  void return_to_pool_locked(Block* b);
  Block* new_block();
  void delete_block(Block* b);
  [[noreturn]] void raise_oom_locked(size_t nbytes, size_t alloc_size, const std::string& why);
  void record_trace_locked(const char* action, uintptr_t address, size_t size, c10::StreamId stream);
  PrivatePool* private_pool_locked(c10::MempoolId_t id) const;
  std::vector<Block*> all_heads_locked(const PrivatePool* only) const;

  BlockPool small_{true, nullptr};
  BlockPool large_{false, nullptr};
  std::vector<PendingFree> pending_;  // in the order of the frees
  int64_t pending_bytes_ = 0;
  ska::flat_hash_map<const void*, Block*> allocated_;  // every allocated block by address
  std::map<c10::MempoolId_t, std::unique_ptr<PrivatePool>> private_pools_;
  std::vector<AllocationScope> scopes_;  // innermost last
  std::vector<Block*> spare_blocks_;
};

// The allocator's settings (PYTORCH_NPU_ALLOC_CONF as parsed by Python); one
// acquire load per use.
const AllocatorSettings& settings();
size_t round_size(size_t nbytes);
// How many pending frees there are over every device (the fast path's check).
extern std::atomic<size_t> g_pending_frees;
extern std::atomic<bool> g_trace_enabled;
extern std::atomic<size_t> g_trace_max;
int64_t now_us();

}  // namespace npusim
