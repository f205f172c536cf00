#include "stream.h"

#include "host_wait.h"

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

// ---- streams --------------------------------------------------------------

namespace {

using DeviceStreams = std::array<std::unique_ptr<NpuStream>, kStreamsPerDevice>;

// Leaked on purpose (as are the free lists below): detached stream workers
// may still run while static destructors do at process exit.
std::array<DeviceStreams, kMaxDevices>& all_streams() {
  // A function-local static rather than std::call_once: called several times
  // per op, and its guard is one load once initialized.
  static auto& streams = []() -> std::array<DeviceStreams, kMaxDevices>& {
    auto& made = *new std::array<DeviceStreams, kMaxDevices>();
    mark_devices_in_use();
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
// Streams being captured, over all devices: while zero nothing asks a capture.
std::atomic<int> g_captured_streams{0};
std::array<std::atomic<CompletionHook>, kMaxCompletionHooks> g_completion_hooks{};

void run_completion_hooks() {
  for (const auto& slot : g_completion_hooks) {
    const CompletionHook hook = slot.load(std::memory_order_acquire);
    if (hook == nullptr) {
      return;  // hooks fill the slots in order
    }
    hook();
  }
}
}  // namespace

bool any_stream_capturing() {
  return g_captured_streams.load(std::memory_order_acquire) != 0;
}

void add_completion_hook(CompletionHook hook) {
  for (auto& slot : g_completion_hooks) {
    CompletionHook expected = nullptr;
    if (slot.compare_exchange_strong(expected, hook, std::memory_order_acq_rel) || expected == hook) {
      return;  // installed (or already there)
    }
  }
  TORCH_CHECK(false, "npusim: more than ", kMaxCompletionHooks, " stream completion hooks");
}

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

void NpuStream::set_capture(StreamCapture* capture) {
  StreamCapture* const previous = capture_.exchange(capture, std::memory_order_acq_rel);
  if ((previous == nullptr) != (capture == nullptr)) {
    g_captured_streams.fetch_add(capture != nullptr ? 1 : -1, std::memory_order_acq_rel);
  }
}

void NpuStream::enqueue(std::function<void()> fn, double duration_us, const char* op) {
  if (StreamCapture* graph = capture()) {
    graph->add_task(std::move(fn), duration_us, op);
    return;
  }
  push(std::move(fn), duration_us, op,
      profiler_active() ? profile_task(op, device_, id_, activity_kind(op), duration_us) : nullptr);
  if (launch_blocking() && !on_stream_worker()) {
    synchronize();
  }
}

void NpuStream::enqueue_unobserved(std::function<void()> fn, const char* op) {
  push(std::move(fn), 0.0, op, nullptr);
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
  enter_stream_worker(device_);
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
      run_profiled(*task.profile, [&] { run_task(task); });
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
    run_completion_hooks();
  }
}

bool NpuStream::wait_completed(uint64_t target, double timeout_s) {
  TORCH_CHECK(!(on_stream_worker() && current_device() == device_ && target > completed()),
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
  if (StreamCapture* graph = capture()) {
    graph->refuse_host_wait(*this, "synchronize");
  }
  const uint64_t target = enqueued();
  const bool done = wait_completed(target, timeout_s);
  TORCH_CHECK(done, "synchronize_stream: ", name(), " did not finish its ",
      target - completed(), " pending task(s) within ", timeout_s, " s");
  raise_pending_error();
  run_completion_hooks();
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
    device = current_device();
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

}  // namespace npusim
