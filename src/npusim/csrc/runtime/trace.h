// What the device core tells observers: torch.profiler (device tasks and
// memory events) and npusim's stream sanitizer (stream and event orderings,
// frees). Everything here is off, and costs one load, unless observed.
// See Note [Device tasks in torch.profiler].
#pragma once

#include <c10/util/ThreadLocalDebugInfo.h>
#include <c10/core/Device.h>

#include "npu_type.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace npusim {

// ---- torch.profiler ---------------------------------------------------------

// True when the calling thread runs under torch.profiler (its state is in the
// thread's debug info): a task enqueued now carries that state to the worker.
inline bool profiler_active() {
  return c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr;
}

// What a device activity is to the profiler (kineto's activity types:
// kernels, memcpys, synchronizations).
enum class ActivityKind : int { kKernel = 0, kMemcpy = 1, kSync = 2 };

// The row of a collective backend's work on its device, after the streams'.
constexpr int kCommLane = kStreamsPerDevice;

// One device task as torch.profiler shows it: on the row (device, lane) of
// its stream, from when the stream started it to when it completed (its
// modelled duration included), linked to the op whose range was innermost on
// the launching thread (as CUPTI links kernels by correlation id).
struct DeviceActivity {
  std::string name;
  int device = 0;
  int lane = 0;  // the stream id, or kCommLane
  ActivityKind kind = ActivityKind::kKernel;
  uint64_t correlation = 0;  // 0: launched outside any op
  double modelled_us = 0.0;  // the timing model's part of its duration
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// True while a torch.profiler session with PrivateUse1 activities records
// (runtime/device_profiler.cpp): one load.
extern std::atomic<bool> g_recording_device_activities;
inline bool recording_device_activities() {
  return g_recording_device_activities.load(std::memory_order_acquire);
}

// A device task's profile: the enqueuing thread's profiler state (so that the
// worker reports the task's allocations and frees as the profiler's memory
// events) and, while device activities are recorded, the task's activity.
// Only the profiler's debug info, not the whole at::ThreadLocalState, which
// would carry Python objects (saved-tensor hooks, dispatch modes) that a
// stream worker, which never holds the GIL, must not release.
struct TaskProfile {
  std::shared_ptr<c10::ThreadLocalDebugInfo> debug_info;
  std::optional<DeviceActivity> activity;
};

// Null unless profiler_active(). Called on the launching thread: the
// activity's correlation is that thread's innermost op.
std::shared_ptr<TaskProfile> profile_task(std::string name, c10::DeviceIndex device, int lane, ActivityKind kind,
    double modelled_us);
// Runs fn as the task `profile` describes: under its profiler state, timed
// as its device activity (which is then handed to the profiler session).
void run_profiled(TaskProfile& profile, const std::function<void()>& fn);
// The kind of a stream task from its label: copies are memcpys, event
// records and waits synchronizations, the rest kernels.
ActivityKind activity_kind(const char* label);

// The innermost op range of the calling thread, as the profiler session
// tells it (push/pop of kineto's correlation ids); 0 outside any.
void push_correlation(uint64_t id, bool user_scope);
void pop_correlation(bool user_scope);
uint64_t current_correlation();
// Completed activities since the recording began (device_profiler.cpp).
void start_device_activities();
std::vector<DeviceActivity> stop_device_activities();

// Names the calling thread (visible in profiler traces, top, gdb); at most 15 chars.
void name_thread(const std::string& name);

// Allocation and free of `nbytes` at `ptr` (device < 0: pinned host memory),
// with the totals after the change; reported to the profiler's memory events
// and, while the sanitizer listens, logged for it.
void note_memory(void* ptr, int64_t delta, int64_t allocated, int64_t reserved, c10::DeviceIndex device);

// ---- the sanitizer ----------------------------------------------------------

enum class StreamOp : int {
  kRecordEvent = 0,  // event recorded on (device, stream)
  kWaitEvent = 1,    // (device, stream) waits for event
  kSyncEvent = 2,    // the host waited for event
  kSyncStream = 3,   // the host waited for (device, stream)
  kSyncDevice = 4,   // the host waited for every stream of device
  kSyncAll = 5,      // the host waited for every stream of every device
  kDestroyEvent = 6,
};
using StreamOpHook = void (*)(int op, uintptr_t event, int device, int64_t stream);
void set_stream_op_hook(StreamOpHook hook);
extern std::atomic<StreamOpHook> g_stream_op_hook;
// Called by the device guard and the synchronize bindings, on host threads.
inline void trace_stream_op(StreamOp op, const void* event, int device, int64_t stream) {
  if (StreamOpHook hook = g_stream_op_hook.load(std::memory_order_acquire)) {
    hook(static_cast<int>(op), reinterpret_cast<uintptr_t>(event), device, stream);
  }
}

struct MemoryEvent {
  uintptr_t ptr;
  int64_t delta;  // > 0 allocation, < 0 free
  int device;
};
// Called by note_memory on whatever thread allocates or frees.
using MemoryHook = void (*)(const MemoryEvent& event);
void set_memory_hook(MemoryHook hook);
// For a hook that cannot handle an event on the thread it came from (a stream
// worker without the GIL): kept until take_memory_events().
void log_memory_event(const MemoryEvent& event);
std::vector<MemoryEvent> take_memory_events();

}  // namespace npusim
