// Device and pinned host memory of the simulated NPU: allocation with
// per-device accounting and capacity, and stream-ordered release.
#include "memory.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

namespace npusim {

// ---- memory ---------------------------------------------------------------

// Note [Stream-ordered free]
// Device memory is host memory that stream workers read and write after the
// host has moved on. A block freed by the host (tensor dropped, FSDP's
// storage.resize_(0)) may still be the target of queued work, so its release
// is deferred until every stream that had pending work at the time of the
// free has passed that point. `allocated` drops at once, as on CUDA;
// `reserved` keeps counting the block until it is really released.

namespace {

std::string format_bytes(int64_t n) {
  std::ostringstream out;
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  out.precision(u == 0 ? 0 : 2);
  out << std::fixed << v << " " << units[u];
  return out.str();
}


struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  c10::DeviceIndex device = -1;  // -1: pinned host memory
  c10::DataPtr adopted;          // memory produced by a CPU kernel
};

struct PendingFree {
  Block* block;
  std::vector<Fence> fences;
};

std::mutex& g_pending_mutex = *new std::mutex();
std::vector<PendingFree>& g_pending = *new std::vector<PendingFree>();
std::atomic<size_t> g_pending_count{0};

std::mutex& g_pinned_mutex = *new std::mutex();
std::map<uintptr_t, size_t>& g_pinned_ranges = *new std::map<uintptr_t, size_t>();

std::array<MemoryStats, kMaxDevices> g_device_stats;
MemoryStats g_pinned_stats;

MemoryStats& stats_of(const Block& b) {
  return b.device < 0 ? g_pinned_stats : g_device_stats[b.device];
}

void bump_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t prev = peak.load();
  while (value > prev && !peak.compare_exchange_weak(prev, value)) {
  }
}

void account_alloc(MemoryStats& s, int64_t n) {
  bump_peak(s.peak_allocated, s.allocated.fetch_add(n) + n);
  bump_peak(s.peak_reserved, s.reserved.fetch_add(n) + n);
  s.num_allocs.fetch_add(1);
}

void release(Block* b) {
  if (b->device < 0) {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_ranges.erase(reinterpret_cast<uintptr_t>(b->ptr));
  }
  stats_of(*b).reserved.fetch_sub(static_cast<int64_t>(b->size));
  if (b->adopted) {
    b->adopted.clear();
  } else {
    std::free(b->ptr);
  }
  delete b;
}

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  MemoryStats& s = stats_of(*b);
  note_memory(b->ptr, -static_cast<int64_t>(b->size), s.allocated.fetch_sub(static_cast<int64_t>(b->size)) -
      static_cast<int64_t>(b->size), s.reserved.load(), b->device);
  auto fences = pending_stream_fences();
  if (fences.empty()) {
    release(b);
    return;
  }
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  g_pending.push_back(PendingFree{b, std::move(fences)});
  g_pending_count.fetch_add(1);
}

void* raw_alloc(size_t nbytes) {
  void* ptr = nullptr;
  const size_t rounded = (nbytes + 63) / 64 * 64;
  if (posix_memalign(&ptr, 64, rounded) != 0) {
    return nullptr;
  }
  return ptr;
}

void check_capacity(c10::DeviceIndex device, size_t nbytes) {
  MemoryStats& s = g_device_stats[device];
  const int64_t cap = s.capacity.load();
  if (cap < 0) {
    return;
  }
  auto over = [&] { return s.reserved.load() + static_cast<int64_t>(nbytes) > cap; };
  if (over() && !on_stream_worker()) {
    synchronize_device(device);  // let deferred frees complete, as CUDA retries after freeing its cache
    reclaim_deferred_frees();
  }
  if (over()) {
    s.num_ooms.fetch_add(1);
    const int64_t free_bytes = std::max<int64_t>(0, cap - s.reserved.load());
    TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory on npu:", static_cast<int>(device),
        ". Tried to allocate ", format_bytes(static_cast<int64_t>(nbytes)), " (", nbytes,
        " bytes); capacity ", format_bytes(cap), ", ", format_bytes(s.allocated.load()),
        " allocated, ", format_bytes(free_bytes), " free (", free_bytes, " bytes).");
  }
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
  void recordStream(const c10::DataPtr&, c10::Stream) override {
    // Frees are stream-ordered for every stream (Note [Stream-ordered free]).
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const MemoryStats& s = memory_stats(device);
    c10::CachingDeviceAllocator::DeviceStats out;
    auto& allocated = out.allocated_bytes[0];
    allocated.current = s.allocated.load();
    allocated.peak = s.peak_allocated.load();
    auto& reserved = out.reserved_bytes[0];
    reserved.current = s.reserved.load();
    reserved.peak = s.peak_reserved.load();
    out.allocation[0].allocated = s.num_allocs.load();
    out.num_ooms = s.num_ooms.load();
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    memory_stats(device).num_allocs = 0;
    memory_stats(device).num_ooms = 0;
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    reset_peak_stats(device);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    const MemoryStats& s = memory_stats(device);
    const int64_t cap = s.capacity.load();
    if (cap < 0) {
      return {0, 0};
    }
    return {static_cast<size_t>(std::max<int64_t>(0, cap - s.reserved.load())), static_cast<size_t>(cap)};
  }
};

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_pinned(nbytes);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

void maybe_reclaim_deferred_frees() {
  if (g_pending_count.load(std::memory_order_acquire) > 0) {
    reclaim_deferred_frees();
  }
}

MemoryStats& memory_stats(c10::DeviceIndex device) {
  check_device_index(device, "memory_stats");
  return g_device_stats[device];
}

c10::Allocator* device_allocator() {
  static DeviceAllocator allocator;
  return &allocator;
}

c10::Allocator* pinned_allocator() {
  static PinnedAllocator allocator;
  return &allocator;
}

c10::DataPtr allocate_device(c10::DeviceIndex device, size_t nbytes) {
  check_device_index(device, "npu allocate");
  start_runtime();
  maybe_reclaim_deferred_frees();
  const c10::Device dev(c10::DeviceType::PrivateUse1, device);
  check_capacity(device, nbytes);
  void* ptr = nbytes == 0 ? nullptr : raw_alloc(nbytes);
  TORCH_CHECK_WITH(OutOfMemoryError, nbytes == 0 || ptr != nullptr,
      "NPU out of memory on npu:", static_cast<int>(device), ": the host could not provide ",
      format_bytes(static_cast<int64_t>(nbytes)));
  auto* block = new Block{ptr, nbytes, device, {}};
  account_alloc(g_device_stats[device], static_cast<int64_t>(nbytes));
  note_memory(ptr, static_cast<int64_t>(nbytes), g_device_stats[device].allocated.load(),
      g_device_stats[device].reserved.load(), device);
  return c10::DataPtr(ptr, block, &free_block, dev);
}

c10::DataPtr adopt_as_device(c10::DataPtr&& cpu, size_t nbytes, c10::DeviceIndex device) {
  check_device_index(device, "npu adopt");
  void* ptr = cpu.get();
  check_capacity(device, nbytes);  // on failure `cpu` frees the memory
  auto* block = new Block{ptr, nbytes, device, std::move(cpu)};
  account_alloc(g_device_stats[device], static_cast<int64_t>(nbytes));
  note_memory(ptr, static_cast<int64_t>(nbytes), g_device_stats[device].allocated.load(),
      g_device_stats[device].reserved.load(), device);
  return c10::DataPtr(ptr, block, &free_block, c10::Device(c10::DeviceType::PrivateUse1, device));
}

c10::DataPtr allocate_pinned(size_t nbytes) {
  start_runtime();
  maybe_reclaim_deferred_frees();
  void* ptr = nbytes == 0 ? nullptr : raw_alloc(nbytes);
  TORCH_CHECK_WITH(OutOfMemoryError, nbytes == 0 || ptr != nullptr,
      "pinned host allocation of ", format_bytes(static_cast<int64_t>(nbytes)), " failed");
  auto* block = new Block{ptr, nbytes, -1, {}};
  if (ptr != nullptr) {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_ranges[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
  }
  account_alloc(g_pinned_stats, static_cast<int64_t>(nbytes));
  note_memory(ptr, static_cast<int64_t>(nbytes), g_pinned_stats.allocated.load(), g_pinned_stats.reserved.load(), -1);
  return c10::DataPtr(ptr, block, &free_block, c10::Device(c10::DeviceType::CPU));
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

int64_t reclaim_deferred_frees() {
  std::vector<Block*> ready;
  {
    std::lock_guard<std::mutex> lock(g_pending_mutex);
    auto passed = [](const PendingFree& pending) {
      for (const auto& [counter, target] : pending.fences) {
        if (counter->load(std::memory_order_acquire) < target) {
          return false;
        }
      }
      return true;
    };
    // stable_partition, not a hand-written compaction: a self-move of the
    // fences vector would empty it and release a block that is still in use.
    auto keep = std::stable_partition(g_pending.begin(), g_pending.end(),
        [&](const PendingFree& pending) { return !passed(pending); });
    for (auto it = keep; it != g_pending.end(); ++it) {
      ready.push_back(it->block);
    }
    g_pending.erase(keep, g_pending.end());
    g_pending_count.store(g_pending.size());
  }
  int64_t released = 0;
  for (Block* b : ready) {
    released += static_cast<int64_t>(b->size);
    release(b);
  }
  return released;
}

void empty_cache() {
  // There is no cache of free blocks; what remains are deferred frees.
  reclaim_deferred_frees();
}

void reset_peak_stats(c10::DeviceIndex device) {
  MemoryStats& s = memory_stats(device);
  s.peak_allocated = s.allocated.load();
  s.peak_reserved = s.reserved.load();
}

}  // namespace npusim
