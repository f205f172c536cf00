// Streams of the simulated NPU: FIFOs of host functions, each run by its own
// worker thread, and the fences that stream-ordered frees wait for. Streams
// know nothing of what runs on them: a capture (an npu graph) and the
// allocator's release of frees reach them through the hooks below, which the
// floors above install.
#pragma once

#include "chip_clock.h"
#include "device.h"
#include "trace.h"

#include <c10/core/Stream.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
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

// CUDA's cudaStreamCaptureMode: which threads' potentially unsafe calls (host
// queries and waits) an underway capture refuses. See Note [Capture-time refusals].
enum class CaptureMode { kGlobal, kThreadLocal, kRelaxed };

// State outside the graph that its replays must prepare (the npu generator's
// graph-safe Philox state, aten/generator.h): told when the capture ends, before
// each replay and when the graph goes away.
class CaptureClient {
 public:
  virtual ~CaptureClient() = default;
  // capture_end: returns what each replay_prologue of this capture is given.
  virtual uint64_t capture_epilogue(uint64_t capture_id) = 0;
  // replay(), on the host, in host order: returns stream work that must run before the
  // graph's tasks on the replay stream (or an empty function).
  virtual std::function<void()> replay_prologue(uint64_t capture_id, uint64_t increment) = 0;
  virtual void capture_destroyed(uint64_t capture_id) = 0;
};

// The device memory a task reads and writes, as its launch knows it (a compute
// op's arguments and outputs, a copy's two sides): byte ranges of whole
// storages, each read or written. Only a capture asks for it; a captured
// graph's replay runs tasks whose ranges do not conflict at once (Note
// [Replaying independent tasks at once], graph/replay_dag.cpp). A task
// launched without one orders every task around it.
struct TaskAccess {
  struct Range {
    uintptr_t begin;
    uintptr_t end;
    bool write;
  };
  c10::SmallVector<Range, 6> ranges;

  void add(const void* data, size_t nbytes, bool write) {
    if (data != nullptr && nbytes > 0) {
      const auto begin = reinterpret_cast<uintptr_t>(data);
      ranges.push_back(Range{begin, begin + nbytes, write});
    }
  }
};

// What a stream asks while it is captured (an npu graph, graph/capture.h,
// implements it; Note [NPU graph capture]). Several streams may belong to one
// capture (Note [Multi-stream capture]).
class StreamCapture {
 public:
  virtual ~StreamCapture() = default;
  virtual uint64_t id() const = 0;
  virtual CaptureMode mode() const = 0;
  // The thread that began the capture (CaptureMode::kThreadLocal).
  virtual std::thread::id thread() const = 0;
  // The stream the capture began on.
  virtual const NpuStream& origin() const = 0;
  // NpuStream::enqueue on a stream of the capture: the task is recorded, not
  // run; `access` (may be null: unknown) is what it reads and writes.
  virtual void add_task(NpuStream& stream, std::function<void()> fn, double duration_us, const char* op,
      const TaskAccess* access) = 0;
  // An event record on a stream of the capture: a node of the graph (its id).
  virtual uint64_t record_event(NpuStream& stream) = 0;
  // `stream` waits on record node `node` of this capture; a stream not in the
  // capture joins it.
  virtual void wait_event(NpuStream& stream, uint64_t node) = 0;
  virtual void add_client(std::shared_ptr<CaptureClient> client) = 0;
  // Records `message` as the capture's failure (the first one wins), raises it.
  [[noreturn]] virtual void refuse(const std::string& message) = 0;
  // A host wait on `stream`, a stream of the capture: CUDA's "operation not
  // permitted when stream is capturing", the capture left valid (Note
  // [Capture-time refusals]).
  [[noreturn]] void refuse_host_wait(const NpuStream& stream, const char* op);
};

// The captures underway (graph/graph.cpp registers them): looked up by id
// (events recorded during a capture name theirs) and scanned by the refusals.
void register_capture(StreamCapture* capture);
void unregister_capture(const StreamCapture* capture);
// Runs fn on capture `id` under the registry's lock; false when it is not underway.
bool with_capture(uint64_t id, const std::function<void(StreamCapture&)>& fn);
// A host query or wait `op` of the user's (Stream.query, Event.synchronize, ...)
// on `target` (null: no one stream): raises CUDA's error, invalidating the capture,
// when `target` is captured or an underway capture's mode forbids the call on this
// thread. `waits_on_device`: the device a device-wide synchronize waits on
// (kAllDevices: every device; -1: none), which no mode lets wait on a captured
// stream. See Note [Capture-time refusals].
constexpr int kAllDevices = -2;
void refuse_unsafe_call_during_capture(const char* op, const NpuStream* target, int waits_on_device = -1);

// Whether any stream of the process is being captured (one atomic load).
bool any_stream_capturing();

// Called after each task a stream worker completes and after each host
// synchronize: the allocators install their release of frees whose fences
// have passed (Note [Stream-ordered free]). At most kMaxCompletionHooks.
using CompletionHook = void (*)();
constexpr int kMaxCompletionHooks = 4;
void add_completion_hook(CompletionHook hook);

// What a task is for when its device has failed (Note [Errors of asynchronous
// work]): work (compute, copies) and waits are skipped after a failure; a
// signal (an event record, a collective's hand-off) still runs, so that
// nothing waits for it forever, and carries the failure on. Under the chip
// clock only work is a launch that costs the host time (Note [Chip clock]).
enum class TaskKind { kWork, kSignal, kWait };

// A device's failure (Note [Sticky device errors]): the first error of
// asynchronous work on the device, kept until the process ends.
bool device_failed(c10::DeviceIndex device);
// "<stream>: <op> failed: <message>", or "" while the device has not failed.
std::string device_failure(c10::DeviceIndex device);
// Raises the device's failure (the device must have failed); `call` names
// the call that found it.
[[noreturn]] void raise_device_failure(c10::DeviceIndex device, const char* call);
// For test harnesses only: forgets the device's failure, as a new process
// would start without it. What was skipped stays skipped.
void clear_device_failure(c10::DeviceIndex device);

// Note [Bounded launch queue]: a host thread that finds this many launches
// pending on a stream waits in its next launch until the stream has fewer.
constexpr uint64_t kDefaultMaxPendingLaunches = 1024;
void set_max_pending_launches(uint64_t count);
uint64_t max_pending_launches();

// Note [Launches at exit]: from begin_exit on, a Python thread other than
// the exiting one is stopped at its next launch or host wait.
void begin_exit();
// Asked of a thread that launches or waits once exit has begun: the Python
// bindings release the GIL for good and return true on a thread that runs
// Python (it is then stopped), false on the core's own threads (they go on).
using ThreadStopHook = bool (*)();
void set_thread_stop_hook(ThreadStopHook hook);
// Stops the calling thread for good (never returns) if exit has begun and it
// is a Python thread other than the exiting one (Note [Launches at exit]).
void stop_thread_if_exiting();
// Waits, never raising, until every stream has completed what was enqueued
// when it was looked at; false at the timeout (timeout_s < 0: no limit).
bool drain_streams(double timeout_s);

// A stream is a FIFO of host functions run by its own worker thread. The
// enqueued/completed counters make query() honest: a popped task that is
// still running counts as pending. See Note [Stream-ordered free] and Note
// [Stream worker wake-ups].
class NpuStream {
 public:
  NpuStream(c10::DeviceIndex device, c10::StreamId id, int priority);
  NpuStream(const NpuStream&) = delete;
  NpuStream& operator=(const NpuStream&) = delete;

  // duration_us > 0 (timing model): the task lasts that long on the chip
  // clock (Note [Chip clock]); with realtime timing the worker also holds the
  // stream that long before running fn.
  // `op` (a string that lives as long as the process: a literal, or an op's
  // interned name) names the task in the error its failure raises and in
  // profiler traces. `access`: what the task reads and writes, for a capture
  // (a launch computes it only while capture() is set; null: unknown).
  void enqueue(std::function<void()> fn, double duration_us = 0.0, const char* op = "task",
      TaskKind kind = TaskKind::kWork, const TaskAccess* access = nullptr);
  // enqueue for a task that a task enqueued next on another stream joins (a
  // replayed side lane, which the replay's origin task waits for): it never
  // blocks under launch blocking, since it may wait on that later task; the
  // joining task's launch blocks for both.
  void enqueue_joined(std::function<void()> fn, const char* op);
  // A task no observer sees (no device activity, never captured, never
  // blocking): the profiler's own timing markers (device_profiler.cpp). A
  // signal: it runs on a failed stream too.
  void enqueue_unobserved(std::function<void()> fn, const char* op);
  bool query() const {
    return completed_.load(std::memory_order_acquire) ==
        enqueued_.load(std::memory_order_acquire);
  }
  // The user's Stream.query: in chip time under the chip clock (Note [Chip clock]).
  bool query_chip_time();
  // The chip time at which the stream's completed work ends (Note [Chip clock]).
  double clock_us() const { return clock_us_.load(std::memory_order_acquire); }
  // timeout_s < 0 waits forever; on timeout raises an error naming the stream.
  // Raises the stream's failure, if any, once every task has completed.
  void synchronize(double timeout_s = -1.0);
  uint64_t enqueued() const { return enqueued_.load(std::memory_order_acquire); }
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  const std::atomic<uint64_t>* completed_counter() const { return &completed_; }
  // Waits until `target` tasks have completed; false on timeout.
  bool wait_completed(uint64_t target, double timeout_s);
  // Work on this stream's device failed (Note [Sticky device errors]).
  bool failed() const { return device_failed(device_); }
  // The device's failure ("" if none), without raising it.
  std::string failure() const { return device_failure(device_); }
  // Fails the stream's device with `message` (a task that inherits another
  // device's failure: a wait for a failed event), unless it has failed already.
  void fail(const std::string& message);
  // Runs body(begin, end) over [0, n) in claims of `grain` items, on the
  // calling thread and, when that is a stream worker running a task, on host
  // threads that wait for its stream meanwhile (Note [A waiting host helps]).
  // An error body raises, on any of those threads, stops the other claims
  // and is rethrown here once no thread is inside the batch.
  static void run_shared(int64_t n, int64_t grain, c10::function_ref<void(int64_t, int64_t)> body);
  // run_shared for items that call ATen kernels: a helping host runs its
  // claims under the worker's at::ThreadLocalState (grad mode, dispatch keys,
  // Python modes), not the waiting user's.
  static void run_shared_as_worker(int64_t n, int64_t grain, c10::function_ref<void(int64_t, int64_t)> body);
  // Whether a task running now on the calling thread could have its items
  // shared (run_shared) with a host that is waiting for its stream at this
  // moment: the calling thread is a stream worker, outside shared work, and
  // a host thread is inside a wait for that stream. Work that splits only to
  // be shared asks this first (a split nobody helps with only costs).
  static bool host_may_help();
  // The items of shared work that waiting host threads have run on this stream.
  uint64_t items_helped() const { return items_helped_.load(std::memory_order_relaxed); }

  c10::DeviceIndex device() const { return device_; }
  c10::StreamId id() const { return id_; }
  int priority() const { return priority_; }
  std::string name() const;
  c10::Stream unwrap() const;
  // Set while this stream belongs to a capture: enqueue then hands tasks to the
  // capture and synchronize raises (Note [NPU graph capture]).
  StreamCapture* capture() const { return capture_.load(std::memory_order_acquire); }
  // Joins (non-null) or leaves (null) a capture.
  void set_capture(StreamCapture* capture);

 private:
  struct Task {
    std::function<void()> fn;
    double duration_us;
    const char* op;
    TaskKind kind;
    std::shared_ptr<TaskProfile> profile;  // null unless enqueued under torch.profiler
    double issue_us = 0.0;  // the host's chip clock when it was launched (Note [Chip clock])
    // The timing model as it was at the launch: placed on the chip clock, and
    // held for its duration in real time (realtime timing).
    bool on_chip_clock = false;
    bool realtime = false;
  };
  // A task of `fn` launched now.
  static Task make_task(std::function<void()> fn, double duration_us, const char* op, TaskKind kind,
      std::shared_ptr<TaskProfile> profile);
  void run();
  void run_task(Task& task);
  void run_fn(Task& task);
  // The chip time a task launched now is issued at (0 off the chip clock).
  static double issue_time(TaskKind kind);
  void push(Task task);
  // push, with the task's profiler record when torch.profiler is active
  void push_observed(std::function<void()> fn, double duration_us, const char* op, TaskKind kind);
  bool wait_for_work(uint64_t popped);
  // Note [Bounded launch queue]
  void wait_for_launch_slot();
  // A waiting host thread's turn at the running task's shared items, if any.
  void help_with_shared_work();
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
  std::atomic<StreamCapture*> capture_{nullptr};
  std::atomic<double> clock_us_{0.0};  // written by the worker only
  struct SharedWork;
  // The items a running task shares (run_shared), and the host threads
  // inside help_with_shared_work, which the task waits out before it ends.
  // Their own cache line: a waiting host reads them at every turn of its
  // spin, and completed_ beside them would bounce between the cores.
  alignas(64) std::atomic<SharedWork*> shared_work_{nullptr};
  std::atomic<int> helpers_{0};
  std::atomic<uint64_t> items_helped_{0};
  // Host threads inside wait_completed (spinning or asleep): host_may_help.
  std::atomic<int> hosts_in_wait_{0};
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

// Whether every fence has passed; the ones that have are dropped.
inline bool fences_passed(std::vector<Fence>& fences) {
  fences.erase(std::remove_if(fences.begin(), fences.end(),
      [](const Fence& f) { return fence_passed(f); }), fences.end());
  return fences.empty();
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
  } else if (chip_clock_on()) {
    host_wait_until(s.clock_us());  // Note [Chip clock]: a host read waits in chip time
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
// then runs on the host whatever its size. Under the chip clock every piece of
// work is a task: its worker places it in chip time (Note [Chip clock]).
// NPUSIM_SMALL_OPS_ON_THE_HOST=0 makes every compute op a task, so that a
// sweep of small samples (`npusim conformance ops --stream-tasks`) checks
// the task path that large ops take.
inline bool tasks_must_show(const NpuStream& stream) {
  return stream.capture() != nullptr || recording_device_activities() || chip_clock_on();
}

// Whether work enqueued on `stream` now would start at once and need not be
// a task (a failed stream skips its work: that must stay a task too).
inline bool done_on_the_host_now(const NpuStream& stream) {
  return !tasks_must_show(stream) && stream.query() && !stream.failed();
}

}  // namespace npusim
