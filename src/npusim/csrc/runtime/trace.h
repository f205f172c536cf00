// What the device core tells observers: torch.profiler (device tasks and
// memory events) and npusim's stream sanitizer (stream and event orderings,
// frees). Everything here is off, and costs one load, unless observed.
// See Note [Device tasks in torch.profiler].
#pragma once

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace npusim {

// ---- torch.profiler ---------------------------------------------------------

// True when the calling thread runs under torch.profiler (its state is in the
// thread's debug info): a task enqueued now is recorded.
inline bool profiler_active() {
  return c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr;
}

// A device task's profile: the enqueuing thread's profiler state and the
// range name ("npu:0 stream 3: foreach_copy"). Only the profiler's part of the
// thread-local state: the whole at::ThreadLocalState would also carry Python
// objects (saved-tensor hooks, dispatch modes) that a stream worker, which
// never holds the GIL, must not release.
struct TaskProfile {
  std::shared_ptr<c10::ThreadLocalDebugInfo> debug_info;
  at::RecordFunctionTLS callbacks;
  std::string name;

  static std::shared_ptr<TaskProfile> capture(std::string name) {
    return std::make_shared<TaskProfile>(
        TaskProfile{c10::ThreadLocalDebugInfo::current(), at::get_record_function_tls_(), std::move(name)});
  }
};

// Runs the rest of the scope under `profile`'s profiler state, inside its range.
class TaskProfileScope {
 public:
  explicit TaskProfileScope(const TaskProfile& profile)
      : debug_info_(profile.debug_info), saved_(at::get_record_function_tls_()) {
    at::set_record_function_tls_(profile.callbacks);
    range_.emplace(at::RecordScope::USER_SCOPE);
    if (range_->isActive()) {
      range_->before(profile.name);
    }
  }
  ~TaskProfileScope() {
    range_.reset();  // ends the range while the profiler's state is still set
    at::set_record_function_tls_(saved_);
  }
  TaskProfileScope(const TaskProfileScope&) = delete;
  TaskProfileScope& operator=(const TaskProfileScope&) = delete;

 private:
  c10::DebugInfoGuard debug_info_;
  at::RecordFunctionTLS saved_;
  std::optional<at::RecordFunction> range_;
};
// Null unless profiler_active().
std::shared_ptr<TaskProfile> profile_task(const std::string& lane, const char* label);

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
