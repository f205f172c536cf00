#include "runtime.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

namespace npusim {

// ---- devices --------------------------------------------------------------

namespace {
std::atomic<int> g_device_count{2};
std::atomic<bool> g_devices_in_use{false};
thread_local c10::DeviceIndex tls_current_device = 0;
thread_local bool tls_is_stream_worker = false;

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
}  // namespace

int device_count() {
  return g_device_count.load();
}

void set_device_count(int count) {
  TORCH_CHECK(count >= 1 && count <= kMaxDevices,
      "npusim: device count must be in [1, ", kMaxDevices, "], got ", count);
  TORCH_CHECK(!g_devices_in_use.load() || count == g_device_count.load(),
      "npusim: the device count can only be set before the first npu device is used "
      "(it is ", g_device_count.load(), ")");
  g_device_count = count;
}

void check_device_index(int64_t index, const char* op) {
  TORCH_CHECK(index >= 0 && index < device_count(), op, ": invalid npu device index ",
      index, "; expected 0 <= index < device_count() = ", device_count());
}

c10::DeviceIndex current_device() {
  return tls_current_device;
}

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index, "set_device");
  tls_current_device = index;
}

// ---- timing model ---------------------------------------------------------

TimingModel& timing_model() {
  static TimingModel model;
  return model;
}

double copy_task_us(size_t bytes) {
  auto& m = timing_model();
  const double bw = m.copy_bytes_per_us.load();
  return m.launch_latency_us.load() + (bw > 0 ? static_cast<double>(bytes) / bw : 0.0);
}

double link_task_us(size_t bytes) {
  auto& m = timing_model();
  const double bw = m.link_bytes_per_us.load();
  return m.launch_latency_us.load() + (bw > 0 ? static_cast<double>(bytes) / bw : 0.0);
}

// ---- streams --------------------------------------------------------------

namespace {
void maybe_reclaim();

// NPUSIM_LAUNCH_BLOCKING=1 makes every enqueue wait for its task (like
// CUDA_LAUNCH_BLOCKING): a debugging aid for ordering bugs.
bool launch_blocking() {
  static const bool blocking = [] {
    const char* v = std::getenv("NPUSIM_LAUNCH_BLOCKING");
    return v != nullptr && std::string(v) == "1";
  }();
  return blocking;
}

using DeviceStreams = std::array<std::unique_ptr<NpuStream>, kStreamsPerDevice>;

// Leaked on purpose (as are the free lists below): detached stream workers
// may still run while static destructors do at process exit.
std::array<DeviceStreams, kMaxDevices>& all_streams() {
  static auto& streams = *new std::array<DeviceStreams, kMaxDevices>();
  static std::once_flag once;
  std::call_once(once, [] {
    g_devices_in_use = true;
    for (int d = 0; d < device_count(); ++d) {
      for (int i = 0; i < kStreamsPerDevice; ++i) {
        const int priority = i == 0 ? 0 : ((i - 1) / kPoolSize == 1 ? -1 : 0);
        streams[d][i] = std::make_unique<NpuStream>(
            static_cast<c10::DeviceIndex>(d), static_cast<c10::StreamId>(i), priority);
      }
    }
  });
  return streams;
}

thread_local std::array<c10::StreamId, kMaxDevices> tls_current_stream{};
std::array<std::atomic<uint32_t>, kMaxDevices * kPriorityLevels> g_pool_cursor{};
}  // namespace

NpuStream::NpuStream(c10::DeviceIndex device, c10::StreamId id, int priority)
    : device_(device), id_(id), priority_(priority) {}

std::string NpuStream::name() const {
  std::ostringstream out;
  out << "npu:" << static_cast<int>(device_) << " stream " << id_
      << (id_ == 0 ? " (default)" : "");
  return out.str();
}

c10::Stream NpuStream::unwrap() const {
  return c10::Stream(c10::Stream::UNSAFE,
      c10::Device(c10::DeviceType::PrivateUse1, device_), id_);
}

void NpuStream::enqueue(std::function<void()> fn, double duration_us) {
  push(std::move(fn), duration_us);
  if (launch_blocking() && !tls_is_stream_worker) {
    synchronize();
  }
}

void NpuStream::push(std::function<void()> fn, double duration_us) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!worker_) {
    worker_ = std::make_unique<std::thread>([this] { run(); });
    // The worker lives as long as the process; it is never joined so that
    // interpreter shutdown cannot block on it.
    worker_->detach();
  }
  queue_.push_back(Task{std::move(fn), duration_us});
  enqueued_.fetch_add(1, std::memory_order_acq_rel);
  work_cv_.notify_one();
}

void NpuStream::run() {
  tls_is_stream_worker = true;
  tls_current_device = device_;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [this] { return !queue_.empty(); });
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      task.fn();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error_.empty()) {
        error_ = e.what();
      }
    }
    if (task.duration_us > 0) {
      std::this_thread::sleep_until(
          start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double, std::micro>(task.duration_us)));
    }
    task.fn = nullptr;  // release captures before the task counts as complete
    {
      std::lock_guard<std::mutex> lock(mutex_);
      completed_.fetch_add(1, std::memory_order_acq_rel);
    }
    done_cv_.notify_all();
    maybe_reclaim();
  }
}

bool NpuStream::wait_completed(uint64_t target, double timeout_s) {
  TORCH_CHECK(!(tls_is_stream_worker && tls_current_device == device_ && target > completed()),
      "npusim: a task of ", name(), " waits on its own stream");
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&] { return completed_.load(std::memory_order_acquire) >= target; };
  if (timeout_s < 0) {
    done_cv_.wait(lock, ready);
    return true;
  }
  return done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready);
}

void NpuStream::raise_pending_error() {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error.swap(error_);
  }
  TORCH_CHECK(error.empty(), "npusim: an asynchronous task on ", name(), " failed: ", error);
}

void NpuStream::synchronize(double timeout_s) {
  const uint64_t target = enqueued();
  const bool done = wait_completed(target, timeout_s);
  TORCH_CHECK(done, "synchronize_stream: ", name(), " did not finish its ",
      target - completed(), " pending task(s) within ", timeout_s, " s");
  raise_pending_error();
  maybe_reclaim();
}

NpuStream& stream_for(c10::DeviceIndex device, c10::StreamId id) {
  check_device_index(device, "npu stream");
  TORCH_CHECK(id >= 0 && id < kStreamsPerDevice, "npusim: unknown stream id ", id,
      " on npu:", static_cast<int>(device));
  return *all_streams()[device][id];
}

NpuStream& stream_for(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
      "npusim: expected an npu stream, got a stream of ", stream.device());
  return stream_for(stream.device_index(), stream.id());
}

NpuStream& current_stream(c10::DeviceIndex device) {
  if (device < 0) {
    device = tls_current_device;
  }
  return stream_for(device, tls_current_stream[device]);
}

NpuStream& default_stream(c10::DeviceIndex device) {
  return stream_for(device, 0);
}

NpuStream& stream_from_pool(c10::DeviceIndex device, int priority) {
  check_device_index(device, "npu stream pool");
  const int level = priority < 0 ? 1 : 0;
  const uint32_t slot = g_pool_cursor[device * kPriorityLevels + level].fetch_add(1) % kPoolSize;
  return stream_for(device, static_cast<c10::StreamId>(1 + level * kPoolSize + slot));
}

c10::Stream exchange_current_stream(const c10::Stream& stream) {
  NpuStream& target = stream_for(stream);
  NpuStream& old = current_stream(target.device());
  tls_current_stream[target.device()] = target.id();
  return old.unwrap();
}

void synchronize_device(c10::DeviceIndex device) {
  for (auto& s : all_streams()[device]) {
    s->synchronize();
  }
}

void synchronize_all() {
  for (int d = 0; d < device_count(); ++d) {
    synchronize_device(static_cast<c10::DeviceIndex>(d));
  }
}

// ---- events ---------------------------------------------------------------

void event_record(NpuEvent& event, NpuStream& stream) {
  TORCH_CHECK(event.device < 0 || event.device == stream.device(),
      "Event device npu:", static_cast<int>(event.device),
      " does not match recording stream's device npu:", static_cast<int>(stream.device()));
  event.device = stream.device();
  auto record = std::make_shared<EventRecord>();
  event.record = record;
  stream.enqueue([record] {
    {
      std::lock_guard<std::mutex> lock(record->mutex);
      record->done = true;
      record->when = std::chrono::steady_clock::now();
    }
    record->cv.notify_all();
  });
}

void stream_wait_event(NpuStream& stream, const NpuEvent& event) {
  auto record = event.record;
  if (!record) {
    return;  // never recorded: nothing to wait for (CUDA semantics)
  }
  stream.enqueue([record] {
    std::unique_lock<std::mutex> lock(record->mutex);
    record->cv.wait(lock, [&] { return record->done; });
  });
}

bool event_query(const NpuEvent& event) {
  auto record = event.record;
  if (!record) {
    return true;
  }
  std::lock_guard<std::mutex> lock(record->mutex);
  return record->done;
}

void event_synchronize(const NpuEvent& event) {
  auto record = event.record;
  if (!record) {
    return;
  }
  std::unique_lock<std::mutex> lock(record->mutex);
  record->cv.wait(lock, [&] { return record->done; });
}

double event_elapsed_ms(const NpuEvent& start, const NpuEvent& end) {
  TORCH_CHECK(start.enable_timing && end.enable_timing,
      "elapsed_time: both events must be created with enable_timing=True");
  TORCH_CHECK(start.record && end.record,
      "elapsed_time: both events must be recorded before calculating elapsed time");
  TORCH_CHECK(event_query(start) && event_query(end),
      "elapsed_time: both events must have completed; synchronize them first");
  return std::chrono::duration<double, std::milli>(end.record->when - start.record->when).count();
}

void stream_wait_stream(NpuStream& waiter, NpuStream& target) {
  if (&waiter == &target || target.query()) {
    return;
  }
  NpuEvent event;
  event_record(event, target);
  stream_wait_event(waiter, event);
}

// ---- memory ---------------------------------------------------------------

// Note [Stream-ordered free]
// Device memory is host memory that stream workers read and write after the
// host has moved on. A block freed by the host (tensor dropped, FSDP's
// storage.resize_(0)) may still be the target of queued work, so its release
// is deferred until every stream that had pending work at the time of the
// free has passed that point. `allocated` drops at once, as on CUDA;
// `reserved` keeps counting the block until it is really released.

namespace {

struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  c10::DeviceIndex device = -1;  // -1: pinned host memory
  c10::DataPtr adopted;          // memory produced by a CPU kernel
};

struct PendingFree {
  Block* block;
  std::vector<std::pair<NpuStream*, uint64_t>> fences;
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

std::vector<std::pair<NpuStream*, uint64_t>> pending_fences() {
  std::vector<std::pair<NpuStream*, uint64_t>> fences;
  auto& streams = all_streams();
  for (int d = 0; d < device_count(); ++d) {
    for (auto& s : streams[d]) {
      const uint64_t enq = s->enqueued();
      if (s->completed() < enq) {
        fences.emplace_back(s.get(), enq);
      }
    }
  }
  return fences;
}

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  stats_of(*b).allocated.fetch_sub(static_cast<int64_t>(b->size));
  auto fences = pending_fences();
  if (fences.empty()) {
    release(b);
    return;
  }
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  g_pending.push_back(PendingFree{b, std::move(fences)});
  g_pending_count.fetch_add(1);
}

void maybe_reclaim() {
  if (g_pending_count.load(std::memory_order_acquire) > 0) {
    reclaim_deferred_frees();
  }
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
  if (over() && !tls_is_stream_worker) {
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

MemoryStats& memory_stats(c10::DeviceIndex device) {
  check_device_index(device, "memory_stats");
  return g_device_stats[device];
}

MemoryStats& host_pinned_stats() {
  return g_pinned_stats;
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
  all_streams();
  maybe_reclaim();
  const c10::Device dev(c10::DeviceType::PrivateUse1, device);
  check_capacity(device, nbytes);
  void* ptr = nbytes == 0 ? nullptr : raw_alloc(nbytes);
  TORCH_CHECK_WITH(OutOfMemoryError, nbytes == 0 || ptr != nullptr,
      "NPU out of memory on npu:", static_cast<int>(device), ": the host could not provide ",
      format_bytes(static_cast<int64_t>(nbytes)));
  auto* block = new Block{ptr, nbytes, device, {}};
  account_alloc(g_device_stats[device], static_cast<int64_t>(nbytes));
  return c10::DataPtr(ptr, block, &free_block, dev);
}

c10::DataPtr adopt_as_device(c10::DataPtr&& cpu, size_t nbytes, c10::DeviceIndex device) {
  check_device_index(device, "npu adopt");
  void* ptr = cpu.get();
  check_capacity(device, nbytes);  // on failure `cpu` frees the memory
  auto* block = new Block{ptr, nbytes, device, std::move(cpu)};
  account_alloc(g_device_stats[device], static_cast<int64_t>(nbytes));
  return c10::DataPtr(ptr, block, &free_block, c10::Device(c10::DeviceType::PrivateUse1, device));
}

c10::DataPtr allocate_pinned(size_t nbytes) {
  all_streams();
  maybe_reclaim();
  void* ptr = nbytes == 0 ? nullptr : raw_alloc(nbytes);
  TORCH_CHECK_WITH(OutOfMemoryError, nbytes == 0 || ptr != nullptr,
      "pinned host allocation of ", format_bytes(static_cast<int64_t>(nbytes)), " failed");
  auto* block = new Block{ptr, nbytes, -1, {}};
  if (ptr != nullptr) {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_ranges[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
  }
  account_alloc(g_pinned_stats, static_cast<int64_t>(nbytes));
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
      for (const auto& [stream, target] : pending.fences) {
        if (stream->completed() < target) {
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
