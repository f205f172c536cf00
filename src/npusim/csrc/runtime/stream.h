// Streams of the simulated NPU: FIFOs of host functions, each run by its own
// worker thread, and the fences that stream-ordered frees wait for. Streams
// know nothing of what runs on them: a capture (an npu graph) and the
// allocator's release of frees reach them through the hooks below, which the
// floors above install.
#pragma once

#include "device.h"
#include "trace.h"

#include <c10/core/Stream.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace npusim {

class NpuStream;

// What a stream asks while it is captured (an npu graph, graph/graph.cpp,
// implements it; Note [NPU graph capture]).
class StreamCapture {
 public:
  virtual ~StreamCapture() = default;
  // NpuStream::enqueue on the captured stream: the task is recorded, not run.
  virtual void add_task(std::function<void()> fn, double duration_us, const char* op) = 0;
  // A host wait on the captured stream: invalidates the capture and raises
  // CUDA's "operation not permitted when stream is capturing".
  [[noreturn]] virtual void refuse_host_wait(const NpuStream& stream, const char* op) = 0;
  // Something else the capture cannot record (an op that must synchronize):
  // invalidates the capture and raises `message`.
  [[noreturn]] virtual void invalidate(const std::string& message) = 0;
};

// Whether any stream of the process is being captured (one atomic load).
bool any_stream_capturing();

// Called after each task a stream worker completes and after each host
// synchronize: the allocators install their release of frees whose fences
// have passed (Note [Stream-ordered free]). At most kMaxCompletionHooks.
using CompletionHook = void (*)();
constexpr int kMaxCompletionHooks = 4;
void add_completion_hook(CompletionHook hook);

// What a task is for when its stream has failed (Note [Errors of asynchronous
// work]): work (compute, copies) is skipped after a failure; a signal (an
// event record, a collective's hand-off) still runs, so that nothing waits
// for it forever, and carries the failure on.
enum class TaskKind { kWork, kSignal };

// A stream is a FIFO of host functions run by its own worker thread. The
// enqueued/completed counters make query() honest: a popped task that is
// still running counts as pending. See Note [Stream-ordered free] and Note
// [Stream worker wake-ups].
class NpuStream {
 public:
  NpuStream(c10::DeviceIndex device, c10::StreamId id, int priority);
  NpuStream(const NpuStream&) = delete;
  NpuStream& operator=(const NpuStream&) = delete;

  // duration_us > 0 (timing model): the worker holds the stream that long
  // before running fn, so fn's effects appear when the task completes.
  // `op` (a string that lives as long as the process: a literal, or an op's
  // interned name) names the task in the error its failure raises and in
  // profiler traces.
  void enqueue(std::function<void()> fn, double duration_us = 0.0, const char* op = "task",
      TaskKind kind = TaskKind::kWork);
  // A task no observer sees (no device activity, never captured, never
  // blocking): the profiler's own timing markers (device_profiler.cpp). A
  // signal: it runs on a failed stream too.
  void enqueue_unobserved(std::function<void()> fn, const char* op);
  bool query() const {
    return completed_.load(std::memory_order_acquire) ==
        enqueued_.load(std::memory_order_acquire);
  }
  // timeout_s < 0 waits forever; on timeout raises an error naming the stream.
  // Raises the stream's failure, if any, once every task has completed.
  void synchronize(double timeout_s = -1.0);
  uint64_t enqueued() const { return enqueued_.load(std::memory_order_acquire); }
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  const std::atomic<uint64_t>* completed_counter() const { return &completed_; }
  // Waits until `target` tasks have completed; false on timeout.
  bool wait_completed(uint64_t target, double timeout_s);
  // A task of this stream failed and the failure has not been reported yet
  // (Note [Errors of asynchronous work]).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The failure's message ("" if none), without reporting it.
  std::string failure() const;
  // Makes the stream failed with `message` unless it already is (a task that
  // inherits another stream's failure: a wait for a failed event).
  void fail(const std::string& message);

  c10::DeviceIndex device() const { return device_; }
  c10::StreamId id() const { return id_; }
  int priority() const { return priority_; }
  std::string name() const;
  c10::Stream unwrap() const;
  // Set while this stream is captured: enqueue then hands tasks to the
  // capture and synchronize raises (Note [NPU graph capture]).
  StreamCapture* capture() const { return capture_.load(std::memory_order_acquire); }
  // Begins (non-null) or ends (null) a capture of this stream.
  void set_capture(StreamCapture* capture);

 private:
  struct Task {
    std::function<void()> fn;
    double duration_us;
    const char* op;
    TaskKind kind;
    std::shared_ptr<TaskProfile> profile;  // null unless enqueued under torch.profiler
  };
  void run();
  void run_task(Task& task);
  void push(Task task);
  bool wait_for_work(uint64_t popped);
  void record_error(const char* op, const char* message);
  void raise_pending_error();
  void task_done();

  const c10::DeviceIndex device_;
  const c10::StreamId id_;
  const int priority_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Task> queue_;
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  // Note [Stream worker wake-ups]: the worker sleeps only after spinning
  // idle, and a host thread sleeps on done_cv_ only after spinning too; each
  // side signals the other's condition variable only when it sleeps.
  bool worker_sleeping_ = false;  // guarded by mutex_
  std::atomic<int> host_waiters_{0};
  std::atomic<bool> failed_{false};
  std::string error_;  // the first failure: "<op> failed: <message>" (guarded by mutex_)
  uint64_t skipped_ = 0;  // work skipped since the failure (guarded by mutex_)
  std::atomic<StreamCapture*> capture_{nullptr};
  std::unique_ptr<std::thread> worker_;
};

NpuStream& stream_for(const c10::Stream& stream);
NpuStream& stream_for(c10::DeviceIndex device, c10::StreamId id);
NpuStream& current_stream(c10::DeviceIndex device = -1);
NpuStream& default_stream(c10::DeviceIndex device);
NpuStream& stream_from_pool(c10::DeviceIndex device, int priority);
// Returns the previous current stream of that device (this thread).
c10::Stream exchange_current_stream(const c10::Stream& stream);
void synchronize_device(c10::DeviceIndex device);
// Work queues outside the core's streams (a collective backend's comm
// thread) report issued and finished work here so that frees wait for them
// too. Counters are created once per queue and never destroyed.
struct FenceCounter {
  std::atomic<uint64_t> issued{0};
  std::atomic<uint64_t> finished{0};  // work finishes in issue order
};
FenceCounter* new_fence_counter();

// A fence: (completion counter, value it must reach).
using Fence = std::pair<const std::atomic<uint64_t>*, uint64_t>;
inline bool fence_passed(const Fence& fence) {
  return fence.first->load(std::memory_order_acquire) >= fence.second;
}
// One fence per stream or fence counter with unfinished work: a block freed
// now may be released once every fence has passed.
std::vector<Fence> pending_stream_fences();
// Creates the streams (once); fixes the device count.
void start_runtime();
void synchronize_all();
// Cheap check used before every host-side op: waits only if work is pending
// (and raises while the stream is capturing, where no host wait is possible).
// A failure not reported yet is raised here too (Note [Errors of
// asynchronous work]).
inline void wait_current_stream_idle(c10::DeviceIndex device) {
  NpuStream& s = current_stream(device);
  if (!s.query() || s.capture() != nullptr || s.failed()) {
    s.synchronize();
  }
}

// Note [Work on an idle stream]
// Every stream task costs a wake-up of the stream's worker thread, and the
// next host op on the stream then waits for that worker
// (wait_current_stream_idle): about 15 us per task on a 2-core machine, where
// a small op costs a few. A task enqueued on an idle stream (everything
// enqueued so far has completed) would run at once, so for short work the
// host may as well do it in place: an event record on an idle stream
// completes on the host; a wait for an event that has completed enqueues
// nothing (it would do nothing); a small copy on an idle stream is done by
// the caller (aten_ops.cpp copy_from); a compute op whose npu tensors hold
// few elements (op_launch.cpp: compute_on_the_host_now) runs its CPU kernel
// on the host (Note [Compute on the stream]). FSDP2 records, waits and copies
// several times per module per step (issue 15). The host cannot tell the
// difference: the work is done, in stream order, before anything enqueued
// later. The task form stays while the stream is captured into an npu graph
// (the graph must replay the work), while torch.profiler records device
// activities (its trace shows device tasks), on a failed stream (its work is
// skipped, Note [Errors of asynchronous work]) and, for copies and compute,
// under the timing model (a copy then takes its modelled stream time, a
// compute op the duration the compute-cost hook gives it).
// NPUSIM_LAUNCH_BLOCKING=1 keeps every stream idle at each launch, so compute
// then runs on the host whatever its size.
inline bool tasks_must_show(const NpuStream& stream) {
  return stream.capture() != nullptr || recording_device_activities();
}

// Whether work enqueued on `stream` now would start at once and need not be
// a task (a failed stream skips its work: that must stay a task too).
inline bool done_on_the_host_now(const NpuStream& stream) {
  return !tasks_must_show(stream) && stream.query() && !stream.failed();
}

}  // namespace npusim
