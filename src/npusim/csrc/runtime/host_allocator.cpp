// Pinned host memory: one host allocation per block, released once every
// stream that had work pending at its free has passed that point, like
// device memory (Note [Stream-ordered free]).
#include "host_allocator.h"

#include "host_memory.h"
#include "stream.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace npusim {
namespace {

struct PinnedBlock {
  void* ptr = nullptr;
  size_t size = 0;
};

struct PendingPinned {
  PinnedBlock* block;
  std::vector<Fence> fences;
};

// Leaked on purpose: detached stream workers may free blocks while static
// destructors run at process exit.
std::mutex& g_pinned_mutex = *new std::mutex();
std::map<uintptr_t, size_t>& g_pinned_ranges = *new std::map<uintptr_t, size_t>();

// Note [Pinned host memory statistics]
// torch.npu.host_memory_stats() reports CUDA's keys (allocations,
// allocated_bytes, active_requests, active_bytes, each with current / peak /
// allocated / freed; num_host_alloc, num_host_free), and the two resets work
// as CUDA's do (peak back to current; allocated and freed to zero). npusim
// caches no pinned block: every pin_memory() is a host allocation of its own,
// so a block is both owned and active from its allocation to its free, and
// allocations equals active_requests (and the bytes alike). A block leaves
// the counts when the host frees it, whatever the streams are still doing
// (its memory is released later, once no stream can touch it: Note
// [Stream-ordered free]), so the figures are a function of the program alone.
std::mutex& g_host_stats_mutex = *new std::mutex();
at::HostStats& g_host_stats = *new at::HostStats();
std::mutex& g_pinned_pending_mutex = *new std::mutex();
std::vector<PendingPinned>& g_pinned_pending = *new std::vector<PendingPinned>();
std::atomic<size_t> g_pinned_pending_count{0};

void count_pinned_block(int64_t nbytes) {
  std::lock_guard<std::mutex> lock(g_host_stats_mutex);
  auto change = [nbytes](c10::CachingAllocator::Stat& count, c10::CachingAllocator::Stat& bytes) {
    if (nbytes > 0) {
      count.increase(1);
      bytes.increase(static_cast<size_t>(nbytes));
    } else {
      count.decrease(1);
      bytes.decrease(static_cast<size_t>(-nbytes));
    }
  };
  change(g_host_stats.allocations, g_host_stats.allocated_bytes);
  change(g_host_stats.active_requests, g_host_stats.active_bytes);
  (nbytes > 0 ? g_host_stats.num_host_alloc : g_host_stats.num_host_free) += 1;
}

void maybe_reclaim_pinned_frees() {
  if (g_pinned_pending_count.load(std::memory_order_acquire) > 0) {
    reclaim_pinned_frees();
  }
}

void free_pinned(void* ctx) {
  auto* b = static_cast<PinnedBlock*>(ctx);
  count_pinned_block(-static_cast<int64_t>(b->size));
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_ranges.erase(reinterpret_cast<uintptr_t>(b->ptr));
  }
  // Pinned memory may be the source or target of queued copies: released
  // only after every pending stream passes, like device memory.
  auto fences = pending_stream_fences();
  if (!fences.empty()) {
    std::lock_guard<std::mutex> lock(g_pinned_pending_mutex);
    g_pinned_pending.push_back(PendingPinned{b, std::move(fences)});
    g_pinned_pending_count.fetch_add(1);
    return;
  }
  std::free(b->ptr);
  delete b;
}

// One allocator for both faces PyTorch asks for: the hooks' pinned memory
// allocator and torch.accelerator's host allocator (without one registered
// for PrivateUse1, torch.accelerator.empty_host_cache(), which
// torch.accelerator.Graph calls on entering its context, dereferences null).
class PinnedHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_pinned(nbytes);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override {
    return true;  // frees are stream-ordered for every stream (Note [Stream-ordered free])
  }
  void empty_cache() override {
    reclaim_pinned_frees();  // there is no cache; release what no stream can still touch
  }
  at::HostStats get_stats() override {
    return host_stats();
  }
  void reset_accumulated_stats() override {
    reset_host_accumulated_stats();
  }
  void reset_peak_stats() override {
    reset_host_peak_stats();
  }
};

PinnedHostAllocator g_pinned_host_allocator;

}  // namespace

c10::Allocator* pinned_allocator() {
  return &g_pinned_host_allocator;
}

c10::DataPtr allocate_pinned(size_t nbytes) {
  static const bool hooked = (add_completion_hook(&maybe_reclaim_pinned_frees), true);
  (void)hooked;
  start_runtime();
  maybe_reclaim_pinned_frees();
  void* ptr = nbytes == 0 ? nullptr : raw_alloc(nbytes);
  TORCH_CHECK_WITH(OutOfMemoryError, nbytes == 0 || ptr != nullptr,
      "pinned host allocation of ", format_bytes(static_cast<int64_t>(nbytes)), " failed");
  auto* block = new PinnedBlock();
  block->ptr = ptr;
  block->size = nbytes;
  if (ptr != nullptr) {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_ranges[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
  }
  count_pinned_block(static_cast<int64_t>(nbytes));
  return c10::DataPtr(ptr, block, &free_pinned, c10::Device(c10::DeviceType::CPU));
}

bool is_pinned_ptr(const void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto it = g_pinned_ranges.upper_bound(p);
  if (it == g_pinned_ranges.begin()) {
    return false;
  }
  --it;
  return p < it->first + std::max<size_t>(it->second, 1);
}

void reclaim_pinned_frees() {
  std::vector<PinnedBlock*> ready;
  {
    std::lock_guard<std::mutex> lock(g_pinned_pending_mutex);
    auto keep = std::stable_partition(g_pinned_pending.begin(), g_pinned_pending.end(),
        [](const PendingPinned& pending) {
          return !std::all_of(pending.fences.begin(), pending.fences.end(), fence_passed);
        });
    for (auto it = keep; it != g_pinned_pending.end(); ++it) {
      ready.push_back(it->block);
    }
    g_pinned_pending_count.fetch_sub(static_cast<size_t>(std::distance(keep, g_pinned_pending.end())));
    g_pinned_pending.erase(keep, g_pinned_pending.end());
  }
  for (PinnedBlock* b : ready) {
    std::free(b->ptr);
    delete b;
  }
}

at::HostStats host_stats() {
  std::lock_guard<std::mutex> lock(g_host_stats_mutex);
  return g_host_stats;
}

namespace {
// The four counted statistics (guarded by g_host_stats_mutex).
std::array<c10::CachingAllocator::Stat*, 4> counted_host_stats() {
  return {&g_host_stats.allocations, &g_host_stats.allocated_bytes, &g_host_stats.active_requests,
      &g_host_stats.active_bytes};
}
}  // namespace

void reset_host_peak_stats() {
  std::lock_guard<std::mutex> lock(g_host_stats_mutex);
  for (auto* stat : counted_host_stats()) {
    stat->reset_peak();
  }
}

void reset_host_accumulated_stats() {
  std::lock_guard<std::mutex> lock(g_host_stats_mutex);
  for (auto* stat : counted_host_stats()) {
    stat->reset_accumulated();
  }
  g_host_stats.num_host_alloc = 0;
  g_host_stats.num_host_free = 0;
}

}  // namespace npusim

REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, &npusim::g_pinned_host_allocator)
