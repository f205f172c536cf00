#include "trace.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <c10/util/StringUtil.h>

#include <mutex>

#include <pthread.h>

namespace npusim {

// Note [Device tasks in torch.profiler]
// torch 2.13 offers a PrivateUse1 backend no hook for device-side activities
// short of a kineto plugin, but the profiler records every RecordFunction
// range of a thread that carries its thread-local state; that is how it sees
// autograd's worker threads. A task enqueued while the host thread is being
// profiled captures that state, and the stream worker runs the task (its
// modelled duration included) inside a user-scope range under it. Each stream
// worker is a named thread, so the Chrome trace shows one row per stream.
// Allocations and frees go to c10::reportMemoryUsageToProfiler, which the
// profiler's memory events (profile_memory=True) are made of.

std::shared_ptr<TaskProfile> profile_task(const std::string& lane, const char* label) {
  if (!profiler_active()) {
    return nullptr;
  }
  return TaskProfile::capture(c10::str(lane, ": ", label));
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
