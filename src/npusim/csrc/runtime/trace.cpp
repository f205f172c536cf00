#include "trace.h"

#include "chip_clock.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/StringUtil.h>

#include <mutex>
#include <string_view>

#include <pthread.h>

namespace npusim {

// See Note [Device tasks in torch.profiler] in device_profiler.cpp.

std::atomic<bool> g_recording_device_activities{false};

namespace {

// The op ranges open on this thread, innermost last, as kineto pushes their
// correlation ids to the session (ops and user scopes apart, as CUPTI keeps
// them). A recording's generation clears what an earlier one left behind.
struct CorrelationStack {
  uint64_t generation = 0;
  std::vector<uint64_t> ops;
  std::vector<uint64_t> user_scopes;
};
thread_local CorrelationStack tls_correlation;
std::atomic<uint64_t> g_recording_generation{0};

CorrelationStack& correlation_stack() {
  CorrelationStack& stack = tls_correlation;
  const uint64_t generation = g_recording_generation.load(std::memory_order_acquire);
  if (stack.generation != generation) {
    stack = CorrelationStack{generation, {}, {}};
  }
  return stack;
}

std::mutex& g_activities_mutex = *new std::mutex();
std::vector<DeviceActivity>& g_activities = *new std::vector<DeviceActivity>();

void record_activity(DeviceActivity activity) {
  std::lock_guard<std::mutex> lock(g_activities_mutex);
  if (recording_device_activities()) {  // a task that outlived the recording is dropped
    g_activities.push_back(std::move(activity));
  }
}

}  // namespace

void push_correlation(uint64_t id, bool user_scope) {
  CorrelationStack& stack = correlation_stack();
  (user_scope ? stack.user_scopes : stack.ops).push_back(id);
}

void pop_correlation(bool user_scope) {
  CorrelationStack& stack = correlation_stack();
  auto& ids = user_scope ? stack.user_scopes : stack.ops;
  if (!ids.empty()) {
    ids.pop_back();
  }
}

uint64_t current_correlation() {
  const CorrelationStack& stack = correlation_stack();
  // An op's own range, as CUPTI's kernels; a task launched outside any op
  // (a Python-level stream call) goes to its innermost user scope.
  if (!stack.ops.empty()) {
    return stack.ops.back();
  }
  return stack.user_scopes.empty() ? 0 : stack.user_scopes.back();
}

void start_device_activities() {
  anchor_profiler_axis();  // Note [Chip clock]: chip times on the profiler's axis
  std::lock_guard<std::mutex> lock(g_activities_mutex);
  g_activities.clear();
  g_recording_generation.fetch_add(1, std::memory_order_acq_rel);
  g_recording_device_activities.store(true, std::memory_order_release);
}

std::vector<DeviceActivity> stop_device_activities() {
  std::lock_guard<std::mutex> lock(g_activities_mutex);
  g_recording_device_activities.store(false, std::memory_order_release);
  std::vector<DeviceActivity> out;
  out.swap(g_activities);
  return out;
}

ActivityKind activity_kind(const char* label) {
  const std::string_view name(label != nullptr ? label : "");
  if (name.rfind("copy", 0) == 0 || name.rfind("memcpy", 0) == 0) {
    return ActivityKind::kMemcpy;
  }
  // A stream's waits for a collective and its hand-off of a collective's inputs synchronize too.
  if (name == "event_record" || name == "wait_event" || name == "wait_collective" || name == "collective_inputs") {
    return ActivityKind::kSync;
  }
  return ActivityKind::kKernel;
}

std::shared_ptr<TaskProfile> profile_task(std::string name, c10::DeviceIndex device, int lane, ActivityKind kind,
    double modelled_us) {
  if (!profiler_active()) {
    return nullptr;
  }
  auto profile = std::make_shared<TaskProfile>();
  profile->debug_info = c10::ThreadLocalDebugInfo::current();
  if (recording_device_activities()) {
    profile->activity = DeviceActivity{std::move(name), device, lane, kind, current_correlation(), modelled_us, 0, 0};
  }
  return profile;
}

void run_profiled(TaskProfile& profile, const std::function<void()>& fn) {
  const c10::DebugInfoGuard state(profile.debug_info);  // the task's memory events
  if (!profile.activity) {
    fn();
    return;
  }
  // Handed to the session when the task ends, however it ends.
  struct Timed {
    DeviceActivity& activity;
    ~Timed() {
      activity.end_ns = c10::getTime();
      double start_us = 0.0;
      double end_us = 0.0;
      if (take_task_span(&start_us, &end_us)) {  // Note [Chip clock]: the task's chip times
        activity.start_ns = chip_us_to_profiler_ns(start_us);
        activity.end_ns = chip_us_to_profiler_ns(end_us);
      }
      record_activity(std::move(activity));
    }
  } timed{*profile.activity};
  profile.activity->start_ns = c10::getTime();
  forget_task_span();  // one noted by a task that ran unprofiled
  fn();
}

void name_thread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

std::atomic<StreamOpHook> g_stream_op_hook{nullptr};

void set_stream_op_hook(StreamOpHook hook) {
  g_stream_op_hook.store(hook, std::memory_order_release);
}

namespace {
std::atomic<MemoryHook> g_memory_hook{nullptr};
std::mutex& g_memory_log_mutex = *new std::mutex();
std::vector<MemoryEvent>& g_memory_log = *new std::vector<MemoryEvent>();
}  // namespace

void note_memory(void* ptr, int64_t delta, int64_t allocated, int64_t reserved, c10::DeviceIndex device) {
  if (ptr == nullptr) {
    return;
  }
  const c10::Device dev = device < 0 ? c10::Device(c10::DeviceType::CPU)
                                     : c10::Device(c10::DeviceType::PrivateUse1, device);
  c10::reportMemoryUsageToProfiler(ptr, delta, static_cast<size_t>(allocated), static_cast<size_t>(reserved), dev);
  if (MemoryHook hook = g_memory_hook.load(std::memory_order_acquire)) {
    hook(MemoryEvent{reinterpret_cast<uintptr_t>(ptr), delta, device});
  }
}

void set_memory_hook(MemoryHook hook) {
  g_memory_hook.store(hook, std::memory_order_release);
  if (hook == nullptr) {
    std::lock_guard<std::mutex> lock(g_memory_log_mutex);
    g_memory_log.clear();
  }
}

void log_memory_event(const MemoryEvent& event) {
  std::lock_guard<std::mutex> lock(g_memory_log_mutex);
  g_memory_log.push_back(event);
}

std::vector<MemoryEvent> take_memory_events() {
  std::vector<MemoryEvent> out;
  std::lock_guard<std::mutex> lock(g_memory_log_mutex);
  out.swap(g_memory_log);
  return out;
}

}  // namespace npusim
