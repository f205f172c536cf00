#include "graph.h"
#include "host_wait.h"
#include "memory.h"
#include "runtime.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <pthread.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

namespace npusim {

// ---- devices --------------------------------------------------------------

namespace {
// The NPUs of one Atlas training node; NPUSIM_DEVICE_COUNT or
// ASCEND_RT_VISIBLE_DEVICES change it (set from Python before first use).
std::atomic<int> g_device_count{8};
std::atomic<bool> g_devices_in_use{false};
thread_local c10::DeviceIndex tls_current_device = 0;
thread_local bool tls_is_stream_worker = false;
// NPUSIM_LAUNCH_BLOCKING=1 makes every enqueue wait for its task (like
// CUDA_LAUNCH_BLOCKING): a debugging aid for ordering bugs.
std::atomic<bool> g_launch_blocking{false};

// Note [Fork after npu use]
// A forked child has only the forking thread: the parent's stream workers
// are gone, so the first task the child enqueued would wait forever. As
// CUDA and torch_npu do, a child forked after the npu was used is marked,
// and its first device call raises (torch.npu._is_in_bad_fork() says so
// too, which makes torch.manual_seed skip the npu there).
std::atomic<bool> g_in_bad_fork{false};

void mark_forked_child() {
  if (g_devices_in_use.load()) {
    g_in_bad_fork = true;
  }
}

[[maybe_unused]] const int g_fork_handler_installed = pthread_atfork(nullptr, nullptr, &mark_forked_child);

}  // namespace

bool in_bad_fork() {
  return g_in_bad_fork.load(std::memory_order_relaxed);
}

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
  TORCH_CHECK(!in_bad_fork(), op, ": Cannot re-initialize npu in forked subprocess. To use npu "
      "with multiprocessing, you must use the 'spawn' start method");
  TORCH_CHECK(index >= 0 && index < device_count(), op, ": invalid npu device index ",
      index, "; expected 0 <= index < device_count() = ", device_count(),
      index < 0 ? " (torch.device keeps the index in 8 bits: an index above 127 wraps to a "
                  "negative number)" : "");
}

c10::DeviceIndex current_device() {
  return tls_current_device;
}

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index, "set_device");
  tls_current_device = index;
}

void set_launch_blocking(bool blocking) {
  g_launch_blocking = blocking;
}

// ---- timing model ---------------------------------------------------------

TimingModel& timing_model() {
  static TimingModel model;
  return model;
}

namespace {
// 1 GB/s moves 1e9 bytes per 1e6 microseconds.
double task_us(size_t bytes, double gbps) {
  return timing_model().launch_us.load() + (gbps > 0 ? static_cast<double>(bytes) / (gbps * 1e3) : 0.0);
}
}  // namespace

double copy_task_us(size_t bytes) {
  return task_us(bytes, timing_model().copy_gbps.load());
}

double link_task_us(size_t bytes) {
  return task_us(bytes, timing_model().link_gbps.load());
}

// ---- streams --------------------------------------------------------------

namespace {

bool launch_blocking() {
  return g_launch_blocking.load(std::memory_order_relaxed);
}

using DeviceStreams = std::array<std::unique_ptr<NpuStream>, kStreamsPerDevice>;

// Leaked on purpose (as are the free lists below): detached stream workers
// may still run while static destructors do at process exit.
std::array<DeviceStreams, kMaxDevices>& all_streams() {
  // A function-local static rather than std::call_once: called several times
  // per op, and its guard is one load once initialized.
  static auto& streams = []() -> std::array<DeviceStreams, kMaxDevices>& {
    auto& made = *new std::array<DeviceStreams, kMaxDevices>();
    g_devices_in_use = true;
    for (int d = 0; d < device_count(); ++d) {
      for (int i = 0; i < kStreamsPerDevice; ++i) {
        const int priority = i == 0 ? 0 : ((i - 1) / kPoolSize == 1 ? -1 : 0);
        made[d][i] = std::make_unique<NpuStream>(
            static_cast<c10::DeviceIndex>(d), static_cast<c10::StreamId>(i), priority);
      }
    }
    return made;
  }();
  return streams;
}

thread_local std::array<c10::StreamId, kMaxDevices> tls_current_stream{};
// Tasks pushed to any stream and not yet completed: a free with none pending
// (the common case between ops) skips scanning every stream of every device.
std::atomic<uint64_t> g_unfinished_tasks{0};
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

void NpuStream::enqueue(std::function<void()> fn, double duration_us, const char* op) {
  if (GraphCapture* graph = capture()) {
    capture_task(*graph, std::move(fn), duration_us);
    return;
  }
  push(std::move(fn), duration_us, op, profiler_active() ? profile_task(name(), op) : nullptr);
  if (launch_blocking() && !tls_is_stream_worker) {
    synchronize();
  }
}

void NpuStream::push(std::function<void()> fn, double duration_us, const char* op,
    std::shared_ptr<TaskProfile> profile) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!worker_) {
    worker_ = std::make_unique<std::thread>([this] { run(); });
    // The worker lives as long as the process; it is never joined so that
    // interpreter shutdown cannot block on it.
    worker_->detach();
  }
  queue_.push_back(Task{std::move(fn), duration_us, op, std::move(profile)});
  g_unfinished_tasks.fetch_add(1, std::memory_order_acq_rel);
  enqueued_.fetch_add(1, std::memory_order_acq_rel);
  work_cv_.notify_one();
}

void NpuStream::run_task(Task& task) {
  // Under the timing model the task first occupies the stream for its
  // modelled duration and then does its work, so that its results become
  // visible when it completes, as on a device (never early).
  if (task.duration_us > 0) {
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double, std::micro>(task.duration_us)));
  }
  try {
    task.fn();
  } catch (const c10::Error& e) {
    // The message, not the worker thread's C++ backtrace.
    record_error(task.op, e.what_without_backtrace());
  } catch (const std::exception& e) {
    record_error(task.op, e.what());
  }
}

void NpuStream::run() {
  tls_is_stream_worker = true;
  tls_current_device = device_;
  name_thread(c10::str("npu", static_cast<int>(device_), " stream ", id_));
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [this] { return !queue_.empty(); });
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (task.profile) {
      // See Note [Device tasks in torch.profiler].
      const TaskProfileScope scope(*task.profile);
      run_task(task);
    } else {
      run_task(task);
    }
    task.fn = nullptr;
    task.profile = nullptr;  // release captures before the task counts as complete
    {
      std::lock_guard<std::mutex> lock(mutex_);
      completed_.fetch_add(1, std::memory_order_acq_rel);
    }
    g_unfinished_tasks.fetch_sub(1, std::memory_order_acq_rel);
    done_cv_.notify_all();
    maybe_reclaim_deferred_frees();
  }
}

bool NpuStream::wait_completed(uint64_t target, double timeout_s) {
  TORCH_CHECK(!(tls_is_stream_worker && tls_current_device == device_ && target > completed()),
      "npusim: a task of ", name(), " waits on its own stream");
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&] { return completed_.load(std::memory_order_acquire) >= target; };
  return wait_on_host(done_cv_, lock, timeout_s, ready);  // Note [Interruptible host waits]
}

void NpuStream::record_error(const char* op, const char* message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_.empty()) {
    error_ = std::string(op != nullptr ? op : "a task") + " failed: " + message;
  }
}

void NpuStream::raise_pending_error() {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error.swap(error_);
  }
  TORCH_CHECK(error.empty(), "npusim: asynchronous work on ", name(), ": ", error);
}

void NpuStream::synchronize(double timeout_s) {
  if (GraphCapture* graph = capture()) {
    raise_capturing(*graph, *this, "synchronize");
  }
  const uint64_t target = enqueued();
  const bool done = wait_completed(target, timeout_s);
  TORCH_CHECK(done, "synchronize_stream: ", name(), " did not finish its ",
      target - completed(), " pending task(s) within ", timeout_s, " s");
  raise_pending_error();
  maybe_reclaim_deferred_frees();
}

namespace {
std::mutex& g_fence_counters_mutex = *new std::mutex();
std::vector<FenceCounter*>& g_fence_counters = *new std::vector<FenceCounter*>();
std::atomic<size_t> g_fence_counter_count{0};
}  // namespace

FenceCounter* new_fence_counter() {
  auto* counter = new FenceCounter();  // leaked: queues may outlive their owners
  std::lock_guard<std::mutex> lock(g_fence_counters_mutex);
  g_fence_counters.push_back(counter);
  g_fence_counter_count.fetch_add(1, std::memory_order_release);
  return counter;
}

std::vector<Fence> pending_stream_fences() {
  std::vector<Fence> fences;
  // A task pushed before the caller's free is counted here before the free
  // can happen (the pushing thread held a reference to the memory), so zero
  // means no stream can still touch it.
  if (g_unfinished_tasks.load(std::memory_order_acquire) != 0) {
    auto& streams = all_streams();
    for (int d = 0; d < device_count(); ++d) {
      for (auto& s : streams[d]) {
        const uint64_t enq = s->enqueued();
        if (s->completed() < enq) {
          fences.emplace_back(s->completed_counter(), enq);
        }
      }
    }
  }
  if (g_fence_counter_count.load(std::memory_order_acquire) == 0) {
    return fences;
  }
  std::lock_guard<std::mutex> lock(g_fence_counters_mutex);
  for (const FenceCounter* counter : g_fence_counters) {
    const uint64_t issued = counter->issued.load(std::memory_order_acquire);
    if (counter->finished.load(std::memory_order_acquire) < issued) {
      fences.emplace_back(&counter->finished, issued);
    }
  }
  return fences;
}

void start_runtime() {
  all_streams();
}

bool on_stream_worker() {
  return tls_is_stream_worker;
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
  if (in_bad_fork()) {
    return;  // the parent's streams are not this process's to wait for
  }
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
  if (done_on_the_host_now(stream)) {  // Note [Work on an idle stream]
    record->done = true;  // no other thread has this record yet
    record->when = std::chrono::steady_clock::now();
    return;
  }
  stream.enqueue([record] {
    {
      std::lock_guard<std::mutex> lock(record->mutex);
      record->done = true;
      record->when = std::chrono::steady_clock::now();
    }
    record->cv.notify_all();
  }, 0.0, "event_record");
}

void stream_wait_event(NpuStream& stream, const NpuEvent& event) {
  auto record = event.record;
  if (!record) {
    return;  // never recorded: nothing to wait for (CUDA semantics)
  }
  if (!tasks_must_show(stream)) {
    std::lock_guard<std::mutex> lock(record->mutex);
    if (record->done) {
      return;  // Note [Work on an idle stream]
    }
  }
  stream.enqueue([record] {
    std::unique_lock<std::mutex> lock(record->mutex);
    record->cv.wait(lock, [&] { return record->done; });
  }, 0.0, "wait_event");
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
  wait_on_host(record->cv, lock, -1.0, [&] { return record->done; });  // Note [Interruptible host waits]
}

double event_elapsed_ms(const NpuEvent& start, const NpuEvent& end) {
  TORCH_CHECK(start.enable_timing && end.enable_timing,
      "elapsed_time: both events must be created with enable_timing=True");
  TORCH_CHECK(start.record && end.record,
      "elapsed_time: both events must be recorded before calculating elapsed time");
  TORCH_CHECK(start.device == end.device,
      "elapsed_time: both events must be recorded on the same device, got npu:",
      static_cast<int>(start.device), " and npu:", static_cast<int>(end.device));
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

}  // namespace npusim
