#include "stream.h"

#include "host_wait.h"
#include "subnormals.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <pthread.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
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
// Per device, the streams whose worker has started (bit i: stream id i):
// only those can have unfinished work, so a free scans just them.
static_assert(kStreamsPerDevice <= 32, "live stream masks hold 32 streams");
std::array<std::atomic<uint32_t>, kMaxDevices> g_live_streams{};
// Streams outside the devices' tables (the graph's replay lane streams, ids
// from kStreamsPerDevice on) whose worker has started: a free scans them too.
std::mutex& g_unlisted_streams_mutex = *new std::mutex();
std::vector<NpuStream*>& g_unlisted_streams = *new std::vector<NpuStream*>();
std::atomic<size_t> g_unlisted_stream_count{0};

// Called once per stream, when its worker starts.
void note_live_stream(NpuStream& stream) {
  if (stream.id() < kStreamsPerDevice) {
    g_live_streams[stream.device()].fetch_or(uint32_t{1} << stream.id(), std::memory_order_acq_rel);
    return;
  }
  std::lock_guard<std::mutex> lock(g_unlisted_streams_mutex);
  g_unlisted_streams.push_back(&stream);
  g_unlisted_stream_count.fetch_add(1, std::memory_order_release);
}
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

// Note [Stream worker wake-ups]
// A stream's worker sleeps on a condition variable when it has nothing to do,
// and a host thread waiting for the stream sleeps on another. Waking a
// sleeping thread is a futex call and, on a busy 2-core machine, tens of
// microseconds before the woken thread runs: more than a small op costs. Now
// that every compute op is a stream task, a training step enqueues a task
// every few microseconds and waits for the stream at each .item(), so each
// side first spins a short while (kWorkerSpin, kHostSpin) watching the
// counters, sleeps only if nothing came, and the other side signals a
// condition variable only when its counterpart is asleep (push checks
// worker_sleeping_ under the lock; a finished task takes the lock and
// notifies only while host_waiters_ is non-zero). In a steady stream of work
// neither side makes a system call.
//
// How long to spin is set by the gaps a training step leaves, not by one
// op: the worker idles while the host runs the optimizer's Python or
// autograd's bookkeeping, and the host waits at .item() for the backlog of a
// whole step; both gaps last up to a few milliseconds. With spins of 100 us
// (worker) and 50 us (host), both sides slept in each gap, and on a 2-core
// VM whose idle vCPUs are woken by the hypervisor a wake-up took long enough
// that the dispatch-bound MLP step of `bench sim-cost` measured 2.6-3.3 ms
// on npu against 1.7-2.8 ms on CPU; with 1 ms spins 2.5-3.1 ms, with 3 ms
// 1.5-2.8 ms (a fresh process each, 2026-12-03, docs/BENCHMARKS.md). So
// both sides spin 3 ms. The spinner yields every 64 turns (spin_until), so
// a runnable thread on its core (an OpenMP team thread, another rank's
// host) still gets the core; what the spin costs is a core for 3 ms after
// the last task of a burst, the kind of cost an OpenMP team's spin-wait
// has after each parallel region (libgomp spins 300,000 turns by default).
// CUDA's host waits spin too: cudaDeviceScheduleAuto spins unless the
// process has more contexts than there are cores.

namespace {
// The stream whose worker this thread is (null on other threads).
thread_local NpuStream* tls_worker_stream = nullptr;

constexpr auto kWorkerSpin = std::chrono::milliseconds(3);
constexpr auto kHostSpin = std::chrono::milliseconds(3);

// Counts the calling thread in `count` (if any) for its scope.
class ScopedCount {
 public:
  explicit ScopedCount(std::atomic<int>* count) : count_(count) {
    if (count_ != nullptr) {
      count_->fetch_add(1, std::memory_order_seq_cst);
    }
  }
  ~ScopedCount() {
    if (count_ != nullptr) {
      count_->fetch_sub(1, std::memory_order_seq_cst);
    }
  }
  ScopedCount(const ScopedCount&) = delete;
  ScopedCount& operator=(const ScopedCount&) = delete;

 private:
  std::atomic<int>* count_;
};

// Spins until done() or `budget` has passed; true if done().
template <class Done>
bool spin_until(Done done, std::chrono::steady_clock::duration budget) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (int i = 1;; ++i) {
    if (done()) {
      return true;
    }
    cpu_relax();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return done();
      }
      std::this_thread::yield();  // a loaded machine: let the thread we wait for run
    }
  }
}
}  // namespace

// Note [Errors of asynchronous work]
// A task that throws (a CPU kernel's error, an out-of-memory inside a
// kernel) fails its device, as a device-side error does on CUDA: the host is
// long gone, so the error is kept (Note [Sticky device errors]), and every
// later work task on the device's streams is skipped, never run on what the
// failed task should have produced. It still counts as completed, so waits
// return. The failure is raised, naming the stream, the failed op and how
// many tasks were skipped, by every later call that synchronizes with the
// device: synchronize (stream, device, all), Stream.query, Event.query and
// Event.synchronize, a host read (.item(), .cpu(), a blocking copy), any op
// that must run on the host (wait_current_stream_idle); and by every later
// launch on the device. Signals already queued still run
// (TaskKind::kSignal): an event record completes but carries the failure, a
// stream of another device that waits for such an event fails its own
// device in turn (the failure follows the dependency, as a CUDA error
// follows the work that depends on it), and a collective's hand-off still
// lets its comm stream go (the peers would wait for this rank forever).
//
// Note [Sticky device errors]
// On CUDA an error inside device work (an illegal address, a device-side
// assert) is sticky: the context is unusable from then on, and every later
// launch and synchronizing call on the device returns that first error, in
// every thread of the process. npu does the same. Until issue 39 a failure
// was cleared once it had been raised, so with two threads on one stream
// the first thread's synchronize consumed the error and the second thread's
// .item() then read a value that the failed stream had never computed, with
// no error: a silently wrong result. Now the first error of a device is
// kept until the process ends; a second caller of torch.npu.synchronize()
// raises the same error as the first (the count of skipped tasks may have
// grown), and nothing computed from skipped work can be read, since every
// read synchronizes. What does not touch the device's streams still works:
// allocations, frees, tensor metadata, other devices. How a user recovers
// is CUDA's answer too: save what the host holds, end the process and
// start a new one (an elastic launcher such as torchrun restarts the ranks).
// Test harnesses that check errors one after another in one process (the
// suite's tests, the conformance sweep, the fuzzer) forget a failure with
// clear_device_failure (npusim.testing.clear_device_failures), which no
// real device offers; work skipped before that stays skipped.

namespace {

struct DeviceFailure {
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> skipped{0};  // work tasks skipped since the failure
  std::mutex mutex;
  std::string error;  // the first failure: "<stream>: <op> failed: <message>" (guarded by mutex)
};

std::array<DeviceFailure, kMaxDevices>& device_failures() {
  static auto& failures = *new std::array<DeviceFailure, kMaxDevices>();  // leaked: workers outlive statics
  return failures;
}

void count_skipped(c10::DeviceIndex device) {
  device_failures()[device].skipped.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

bool device_failed(c10::DeviceIndex device) {
  return device_failures()[device].failed.load(std::memory_order_acquire);
}

std::string device_failure(c10::DeviceIndex device) {
  DeviceFailure& f = device_failures()[device];
  std::lock_guard<std::mutex> lock(f.mutex);
  return f.error;
}

void raise_device_failure(c10::DeviceIndex device, const char* call) {
  DeviceFailure& f = device_failures()[device];
  const uint64_t skipped = f.skipped.load(std::memory_order_relaxed);
  TORCH_CHECK(false, "npusim: asynchronous work on ", device_failure(device),
      skipped > 0 ? c10::str(" (", skipped, " later task(s) on npu:", static_cast<int>(device), " were skipped)")
                  : std::string(),
      ". npu:", static_cast<int>(device), " stays failed, as a CUDA device does after a device-side error: "
      "every later launch and synchronizing call on it raises this error, in every thread (this call: ", call,
      "); start a new process to use the device again (Note [Sticky device errors])");
}

void clear_device_failure(c10::DeviceIndex device) {
  check_device_index(device, "clear_device_failure");
  DeviceFailure& f = device_failures()[device];
  std::lock_guard<std::mutex> lock(f.mutex);
  f.error.clear();
  f.skipped.store(0, std::memory_order_relaxed);
  f.failed.store(false, std::memory_order_release);
}

void NpuStream::fail(const std::string& message) {
  DeviceFailure& f = device_failures()[device_];
  std::lock_guard<std::mutex> lock(f.mutex);
  if (f.error.empty()) {
    f.error = name() + ": " + message;
    f.failed.store(true, std::memory_order_release);
  }
}

void NpuStream::record_error(const char* op, const char* message) {
  fail(std::string(op != nullptr ? op : "a task") + " failed: " + message);
}

void NpuStream::raise_pending_error() {
  if (failed()) {
    raise_device_failure(device_, "synchronize");
  }
}

// Note [Bounded launch queue]
// A CUDA stream's launch queue is finite: once about a thousand launches are
// pending, the next launch blocks the host until the device has made room.
// Users rely on it: a training loop cannot run more than a few steps ahead of
// the device, so memory held by pending work, the latency of the next
// synchronize and the time Ctrl-C takes all stay bounded. Without a bound a
// loop ran 432 steps ahead of the device in 3 s, and its next synchronize
// took 114 s (issue 39). So a host thread that finds max_pending_launches()
// tasks pending on a stream waits in its launch until the stream has fewer:
// 1024 by default, NPUSIM_MAX_PENDING_LAUNCHES to change it. The wait is a
// host wait (Note [Interruptible host waits]): Ctrl-C ends it with
// KeyboardInterrupt, and the launch it interrupts enqueues nothing. A stream
// worker never waits here (it may be the one that must make room), nor do
// launches under capture (they are recorded, not queued) or the joined side
// lanes of a replay (their origin task, enqueued right after, waits for
// them). With several host threads on one stream the bound is per thread's
// check, so it may be passed by one launch per thread.

namespace {
std::atomic<uint64_t> g_max_pending_launches{kDefaultMaxPendingLaunches};
}  // namespace

void set_max_pending_launches(uint64_t count) {
  TORCH_CHECK(count >= 1, "npusim: the launch queue bound must be at least 1, got ", count);
  g_max_pending_launches.store(count, std::memory_order_relaxed);
}

uint64_t max_pending_launches() {
  return g_max_pending_launches.load(std::memory_order_relaxed);
}

void NpuStream::wait_for_launch_slot() {
  const uint64_t limit = g_max_pending_launches.load(std::memory_order_relaxed);
  const uint64_t enqueued = enqueued_.load(std::memory_order_acquire);
  if (enqueued - completed_.load(std::memory_order_acquire) < limit || on_stream_worker()) {
    return;
  }
  wait_completed(enqueued - limit + 1, -1.0);  // then limit - 1 are pending at most
  stop_thread_if_exiting();  // exit began during the wait: Note [Launches at exit]
}

// Note [Launches at exit]
// At interpreter exit (Python's atexit, after the non-daemon threads have
// been joined) npusim waits for the work queued before exit began; a daemon
// thread that goes on launching would make that wait endless (66 s, issue
// 39) and, once the interpreter finalizes, the thread dies inside a C++ frame
// when it takes the GIL back, which aborts the process ("terminate called
// without an active exception": Python 3.11 ends such a thread with
// pthread_exit, whose unwinding may not pass the noexcept destructor that
// retakes the GIL). So begin_exit marks the process exiting, and from then
// on a Python thread other than the exiting one that launches, or returns
// from a host wait (a launch slot, a synchronize, an event), is stopped
// there for good: its launch is dropped, never queued, and the thread gives
// the GIL up (the hook the Python bindings install) and sleeps, so that it
// can neither read what its dropped work would have produced nor take the
// GIL during finalization. The first such thread prints one line; the
// process exits when the drain is over, and its exit ends the stopped
// threads, as it ends daemon threads anyway. Threads that never ran Python
// (a comm stream, the stream workers) go on: they only finish queued work.

namespace {
std::atomic<bool> g_exiting{false};
std::thread::id g_exit_thread;  // written before g_exiting is set
std::atomic<bool> g_stop_reported{false};
std::atomic<ThreadStopHook> g_thread_stop_hook{nullptr};
}  // namespace

void stop_thread_if_exiting() {
  if (!g_exiting.load(std::memory_order_acquire) || std::this_thread::get_id() == g_exit_thread ||
      on_stream_worker()) {
    return;
  }
  const ThreadStopHook hook = g_thread_stop_hook.load(std::memory_order_acquire);
  if (hook == nullptr || !hook()) {
    return;  // the core's own threads (a comm stream) finish their work
  }
  if (!g_stop_reported.exchange(true, std::memory_order_acq_rel)) {
    std::fputs("npusim: the process is exiting: a thread still using the npu (a daemon thread?) was "
        "stopped at its next launch or wait, and what it launched after exit began is dropped\n", stderr);
    std::fflush(stderr);
  }
  for (;;) {
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

void set_thread_stop_hook(ThreadStopHook hook) {
  g_thread_stop_hook.store(hook, std::memory_order_release);
}

void begin_exit() {
  if (g_exiting.load(std::memory_order_acquire)) {
    return;
  }
  g_exit_thread = std::this_thread::get_id();
  g_exiting.store(true, std::memory_order_release);
}

bool drain_streams(double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const bool bounded = timeout_s >= 0;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(bounded ? timeout_s : 0.0));
  std::vector<NpuStream*> streams;
  for (int d = 0; d < device_count(); ++d) {
    for (auto& s : all_streams()[d]) {
      streams.push_back(s.get());
    }
  }
  {
    std::lock_guard<std::mutex> lock(g_unlisted_streams_mutex);  // the replay lane streams
    streams.insert(streams.end(), g_unlisted_streams.begin(), g_unlisted_streams.end());
  }
  for (NpuStream* s : streams) {
    const double left = bounded ? std::max(std::chrono::duration<double>(deadline - Clock::now()).count(), 0.0)
                                : -1.0;
    if (!s->wait_completed(s->enqueued(), left)) {
      return false;
    }
  }
  return true;
}

void NpuStream::enqueue(std::function<void()> fn, double duration_us, const char* op, TaskKind kind,
    const TaskAccess* access) {
  if (device_failed(device_)) {
    raise_device_failure(device_, op);  // Note [Sticky device errors]
  }
  if (StreamCapture* graph = capture()) {
    graph->add_task(*this, std::move(fn), duration_us, op, access);
    return;
  }
  stop_thread_if_exiting();  // Note [Launches at exit]
  wait_for_launch_slot();
  push_observed(std::move(fn), duration_us, op, kind);
  if (launch_blocking() && !on_stream_worker()) {
    synchronize();
  }
}

double NpuStream::issue_time(TaskKind kind) {
  if (!chip_clock_on()) {
    return 0.0;
  }
  // A task launched by another task (a worker's own launch) is issued at that task's chip time.
  if (TaskClock* clock = current_task_clock()) {
    return clock->now();
  }
  return kind == TaskKind::kWork ? host_launch() : host_clock_us();  // Note [Chip clock]
}

bool NpuStream::query_chip_time() {
  if (!chip_clock_on() || realtime_timing()) {
    return query();
  }
  // In chip time, never in this machine's: Note [Chip clock].
  wait_completed(enqueued(), -1.0);
  host_query();
  return clock_us() <= host_clock_us();
}

void NpuStream::enqueue_joined(std::function<void()> fn, const char* op) {
  TORCH_INTERNAL_ASSERT(capture() == nullptr, "npusim: a joined task is never captured (", op, ")");
  if (device_failed(device_)) {
    raise_device_failure(device_, op);  // Note [Sticky device errors]
  }
  stop_thread_if_exiting();  // Note [Launches at exit]
  push_observed(std::move(fn), 0.0, op, TaskKind::kWait);
}

NpuStream::Task NpuStream::make_task(std::function<void()> fn, double duration_us, const char* op, TaskKind kind,
    std::shared_ptr<TaskProfile> profile) {
  const bool on_chip_clock = chip_clock_on();
  return Task{std::move(fn), duration_us, op, kind, std::move(profile), issue_time(kind), on_chip_clock,
      !on_chip_clock || realtime_timing()};
}

void NpuStream::push_observed(std::function<void()> fn, double duration_us, const char* op, TaskKind kind) {
  push(make_task(std::move(fn), duration_us, op, kind,
      profiler_active() ? profile_task(op, device_, id_, activity_kind(op), duration_us) : nullptr));
}

void NpuStream::enqueue_unobserved(std::function<void()> fn, const char* op) {
  push(make_task(std::move(fn), 0.0, op, TaskKind::kSignal, nullptr));
}

void NpuStream::push(Task task) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!worker_) {
      note_live_stream(*this);
      worker_ = std::make_unique<std::thread>([this] { run(); });
      // The worker lives as long as the process; it is never joined so that
      // interpreter shutdown cannot block on it.
      worker_->detach();
    }
    queue_.push_back(std::move(task));
    g_unfinished_tasks.fetch_add(1, std::memory_order_acq_rel);
    enqueued_.fetch_add(1, std::memory_order_acq_rel);
    wake = worker_sleeping_;
  }
  if (wake) {
    work_cv_.notify_one();
  }
}

void NpuStream::run_task(Task& task) {
  // Realtime timing (and the timing model without the chip clock) first
  // occupies the stream for the task's modelled duration and then does its
  // work, so that its results become visible when it completes (never early).
  if (task.duration_us > 0 && task.realtime) {
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double, std::micro>(task.duration_us)));
  }
  if (!task.on_chip_clock) {
    run_fn(task);
    return;
  }
  // Note [Chip clock]: the task starts when the stream, its issue and what it waits for allow.
  TaskClock clock(std::max(clock_us(), task.issue_us));
  const double start_us = clock.now();
  run_fn(task);
  const double end_us = clock.now() + task.duration_us;
  note_task_span(start_us, end_us);
  clock_us_.store(end_us, std::memory_order_release);
}

void NpuStream::run_fn(Task& task) {
  try {
    task.fn();
  } catch (const c10::Error& e) {
    // The message, not the worker thread's C++ backtrace.
    record_error(task.op, e.what_without_backtrace());
  } catch (const std::exception& e) {
    record_error(task.op, e.what());
  }
}

// Waits until the queue holds a task beyond the `popped` ones taken so far.
bool NpuStream::wait_for_work(uint64_t popped) {
  return spin_until([&] { return enqueued_.load(std::memory_order_acquire) > popped; }, kWorkerSpin);
}

void NpuStream::task_done() {
  completed_.fetch_add(1, std::memory_order_seq_cst);
  g_unfinished_tasks.fetch_sub(1, std::memory_order_acq_rel);
  if (host_waiters_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mutex_); }  // a waiter is either before its check or asleep
    done_cv_.notify_all();
  }
}

void NpuStream::run() {
  enter_stream_worker(device_);
  tls_worker_stream = this;  // Note [A waiting host helps]
  name_thread(c10::str("npu", static_cast<int>(device_), " stream ", id_));
  set_flush_denormal_bits(0);  // not its creator's: Note [Subnormals on npu]
  uint64_t popped = 0;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (queue_.empty()) {
        lock.unlock();
        wait_for_work(popped);
        lock.lock();
        worker_sleeping_ = true;
        work_cv_.wait(lock, [this] { return !queue_.empty(); });
        worker_sleeping_ = false;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      ++popped;
      // See Note [Errors of asynchronous work]: a failed device skips its work.
      if (task.kind != TaskKind::kSignal && device_failed(device_)) {
        count_skipped(device_);
        task.fn = nullptr;
      }
    }
    if (task.fn) {
      if (task.profile) {
        // See Note [Device tasks in torch.profiler].
        run_profiled(*task.profile, [&] { run_task(task); });
      } else {
        run_task(task);
      }
    }
    task.fn = nullptr;
    task.profile = nullptr;  // release captures before the task counts as complete
    task_done();
    run_completion_hooks();
  }
}

bool NpuStream::wait_completed(uint64_t target, double timeout_s) {
  TORCH_CHECK(!(on_stream_worker() && current_device() == device_ && target > completed()),
      "npusim: a task of ", name(), " waits on its own stream");
  auto ready = [&] { return completed_.load(std::memory_order_acquire) >= target; };
  if (ready()) {
    return true;
  }
  const auto spin = timeout_s < 0 ? kHostSpin
      : std::min<std::chrono::steady_clock::duration>(kHostSpin,
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s)));
  const bool host = !on_stream_worker();
  // Counted for host_may_help while it waits, asleep or not.
  const ScopedCount in_wait(host ? &hosts_in_wait_ : nullptr);
  auto ready_or_help = [&] {
    // The inline check keeps the spin's turn a pair of loads while nothing is shared.
    if (host && shared_work_.load(std::memory_order_relaxed) != nullptr) {
      help_with_shared_work();  // Note [A waiting host helps]
    }
    return ready();
  };
  if (spin_until(ready_or_help, spin)) {
    return true;
  }
  // Counted while asleep (the worker then notifies); the interrupt check may throw out of the wait.
  const ScopedCount asleep(&host_waiters_);
  // Asleep, it is also woken by a task that shares its work (Note [A waiting host helps]).
  auto ready_or_work = [&] { return ready() || (host && shared_work_.load(std::memory_order_seq_cst) != nullptr); };
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(timeout_s, 0.0)));
  for (;;) {
    const double left = timeout_s < 0 ? -1.0
        : std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!wait_on_host(done_cv_, lock, left, ready_or_work)) {  // Note [Interruptible host waits]
        return false;
      }
    }
    if (ready()) {
      break;
    }
    help_with_shared_work();
  }
  stop_thread_if_exiting();  // exit began during the wait: Note [Launches at exit]
  return true;
}

// Note [A waiting host helps]
// The device's copies and random fills are this machine's loops, and one
// thread's loop is the simulated device's speed: a _foreach_copy_ of 1000
// tensors of 4 KiB (FSDP2's shards) is about 290 us of memmove on one core of
// the 2-core VM, and 155 us on two. Launched back to back such work fills the
// launch queue (Note [Bounded launch queue]), and the host spends that time
// waiting for a launch slot, or for the stream at a synchronize: a core that
// does nothing. Giving the copy a second thread of its own (the worker's
// OpenMP team) made it slower, 0.68 of CPU-native against 0.49 (`bench
// sim-cost`), because the waiting host's spin and the team thread then share
// a core. So the waiting host does the work instead. A task whose work is a
// batch of independent items (the spans of a foreach copy, the counter ranges
// of a Philox fill, whose numbers depend on the element's index only) shares
// them (run_shared), and a host thread that waits for that stream claims items
// between its checks of the counter it waits on (wait_completed's spin; a
// host whose spin has ended and sleeps is woken by the task to help). The
// task claims items too, and ends only when every item is done and no host is
// inside the batch (helpers_: a host counts itself before it reads the batch,
// and the task withdraws the batch before it waits for the count to reach
// zero, so no host reads a batch that has ended). Nothing else changes: the
// task is still one task in stream order, launched, timed on the chip clock
// and seen by observers as before, and its results are the worker's alone; a
// host that does not wait, or waits for another stream, never helps
// (items_helped counts what hosts ran). The foreach copy's ratio went from
// 0.53 to 0.41 of CPU-native, and normal_ over 65536 elements from 1794 to
// 1388 us (log1pf, the bulk of it, gains less from the second core than
// memmove does). CUDA's copies run on copy engines while its host's wait only
// spins; here the host's core is where the device's bandwidth is.

namespace {

// Set while the thread runs claims of a batch of shared work.
thread_local bool tls_in_shared_work = false;

struct InSharedWork {
  InSharedWork() { tls_in_shared_work = true; }
  ~InSharedWork() { tls_in_shared_work = false; }
  InSharedWork(const InSharedWork&) = delete;
  InSharedWork& operator=(const InSharedWork&) = delete;
};

// Puts the calling thread's intra-op thread count (its OpenMP team size)
// back when the scope ends. A task sets its kernel's team on the thread that
// runs it (Note [A core for the host]); a host thread that runs a task of its
// stream's worker (run_shared_as_worker) leaves with the user's count, as it came.
class KeepIntraopThreads {
 public:
  KeepIntraopThreads() : threads_(at::get_num_threads()) {}
  ~KeepIntraopThreads() {
    if (at::get_num_threads() != threads_) {
      at::set_num_threads(threads_);
    }
  }
  KeepIntraopThreads(const KeepIntraopThreads&) = delete;
  KeepIntraopThreads& operator=(const KeepIntraopThreads&) = delete;

 private:
  int threads_;
};

}  // namespace

struct NpuStream::SharedWork {
  int64_t n;
  int64_t grain;
  c10::function_ref<void(int64_t, int64_t)> body;
  // On a cache line of its own: the claims write it from both threads, while
  // the fields above are only read.
  alignas(64) std::atomic<int64_t> next{0};
  // The first error a claim raised, on any thread; the task rethrows it.
  std::mutex error_mutex;
  std::exception_ptr error;

  // Claims and runs items until none are left; returns the items this thread
  // ran. The plain load first keeps a thread that finds the batch exhausted
  // from writing the counter's cache line, which the other thread's next
  // claim would then wait for. A claim that throws ends the batch for every
  // thread, and never leaves this function: a host's error is the task's.
  int64_t run_claims() {
    int64_t ran = 0;
    while (next.load(std::memory_order_relaxed) < n) {
      const int64_t begin = next.fetch_add(grain, std::memory_order_relaxed);
      if (begin >= n) {
        break;
      }
      const int64_t end = std::min(n, begin + grain);
      try {
        body(begin, end);
      } catch (...) {
        next.store(n, std::memory_order_relaxed);
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) {
          error = std::current_exception();
        }
        break;
      }
      ran += end - begin;
    }
    return ran;
  }
};

void NpuStream::run_shared(int64_t n, int64_t grain, c10::function_ref<void(int64_t, int64_t)> body) {
  NpuStream* const stream = tls_worker_stream;
  // Inside a claim of shared work (a task of a replayed graph that copies),
  // the thread runs it alone: a stream shares one batch at a time.
  if (n <= grain || stream == nullptr || tls_in_shared_work) {
    body(0, n);
    return;
  }
  const InSharedWork inside;
  SharedWork work{n, grain, body};
  stream->shared_work_.store(&work, std::memory_order_seq_cst);
  if (stream->host_waiters_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(stream->mutex_); }  // as task_done: a sleeping host wakes to help
    stream->done_cv_.notify_all();
  }
  work.run_claims();
  stream->shared_work_.store(nullptr, std::memory_order_seq_cst);
  // A host finishing its last claim; it yields now and then, in case that
  // host was put aside on a loaded machine.
  while (!spin_until([stream] { return stream->helpers_.load(std::memory_order_seq_cst) == 0; }, kHostSpin)) {
  }
  if (work.error) {
    std::rethrow_exception(work.error);  // the task fails: Note [Errors of asynchronous work]
  }
}

void NpuStream::run_shared_as_worker(int64_t n, int64_t grain, c10::function_ref<void(int64_t, int64_t)> body) {
  if (n <= grain || tls_worker_stream == nullptr || tls_in_shared_work) {
    body(0, n);  // run_shared would run it here alone
    return;
  }
  const at::ThreadLocalState worker_state;
  const std::thread::id worker = std::this_thread::get_id();
  run_shared(n, grain, [&](int64_t begin, int64_t end) {
    std::optional<at::ThreadLocalStateGuard> state;
    std::optional<KeepIntraopThreads> threads;
    if (std::this_thread::get_id() != worker) {
      state.emplace(worker_state);
      threads.emplace();
    }
    body(begin, end);
  });
}

bool NpuStream::host_may_help() {
  const NpuStream* const stream = tls_worker_stream;
  return stream != nullptr && !tls_in_shared_work && stream->hosts_in_wait_.load(std::memory_order_relaxed) > 0;
}

void NpuStream::help_with_shared_work() {
  if (shared_work_.load(std::memory_order_relaxed) == nullptr) {
    return;
  }
  helpers_.fetch_add(1, std::memory_order_seq_cst);
  if (SharedWork* work = shared_work_.load(std::memory_order_seq_cst)) {
    const InSharedWork inside;
    const KeepSubnormals keep_subnormals;  // the device's arithmetic, not the user's: Note [Subnormals on npu]
    items_helped_.fetch_add(static_cast<uint64_t>(work->run_claims()), std::memory_order_relaxed);
    // Exhausted: later turns of this wait need not look again.
    shared_work_.compare_exchange_strong(work, nullptr, std::memory_order_seq_cst);
  }
  helpers_.fetch_sub(1, std::memory_order_seq_cst);
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
  if (chip_clock_on()) {
    host_wait_until(clock_us());  // Note [Chip clock]
  }
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
      for (uint32_t live = g_live_streams[d].load(std::memory_order_acquire); live != 0; live &= live - 1) {
        const NpuStream& s = *streams[d][__builtin_ctz(live)];
        const uint64_t enq = s.enqueued();
        if (s.completed() < enq) {
          fences.emplace_back(s.completed_counter(), enq);
        }
      }
    }
    if (g_unlisted_stream_count.load(std::memory_order_acquire) != 0) {
      std::lock_guard<std::mutex> lock(g_unlisted_streams_mutex);
      for (const NpuStream* s : g_unlisted_streams) {
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
  // Refused before anything is waited for: a device synchronize would wait on
  // the captured streams, whose work never runs during capture.
  for (auto& s : all_streams()[device]) {
    if (StreamCapture* graph = s->capture()) {
      graph->refuse_host_wait(*s, "synchronize");
    }
  }
  for (auto& s : all_streams()[device]) {
    s->synchronize();
  }
}

// ---- captures underway and the calls they refuse ---------------------------------

// Note [Capture-time refusals]
// A capture records work instead of running it, so a host wait on a captured
// stream (or on an event recorded into the capture) would wait for work that
// never runs: CUDA raises instead, and so does npusim, never hanging. These
// raise CUDA's error: synchronize of a captured stream or its device,
// Stream.query, Event.query / synchronize / elapsed_time of an event recorded
// during capture ("operation not permitted on an event last recorded in a
// capturing stream"), .item() / .cpu() and blocking host<->device copies on a
// captured stream. On CUDA the capture is then invalidated; on the NPU the
// runtime rejects the stream synchronization and the capture goes on
// (torch_npu's test_aclgraph_pin_memory reads .item() inside a capture, expects
// the error, then ends the capture and uses the graph), and npu follows
// torch_npu: a rejected wait leaves the capture valid, and the rejected call
// enqueued nothing into it. What CUDA's capture_error_mode refuses as
// potentially unsafe (the user's host queries and waits on streams and events
// outside the capture: "global" from any thread, "thread_local" from the
// thread that began the capture, "relaxed" never) and what breaks the graph's
// structure (a dependency on uncaptured work, a merge of two captures) still
// invalidate the capture, which capture_end then reports. Those refusals are
// checked where the user's calls come in (the device guard's query /
// synchronize hooks, torch.npu.synchronize): npusim's own waits on streams
// that are not captured (a free waiting on a fence, a blocking copy on another
// stream) are not refused. The caching allocator refuses empty_cache while a
// capture of its device is underway, as CUDA's does (its captures_underway
// assertion), without invalidating the capture.

namespace {

std::mutex& g_captures_mutex = *new std::mutex();
std::vector<StreamCapture*>& g_captures = *new std::vector<StreamCapture*>();
std::atomic<int> g_capture_count{0};

const char* mode_name(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::kThreadLocal:
      return "thread_local";
    case CaptureMode::kRelaxed:
      return "relaxed";
    default:
      return "global";
  }
}

}  // namespace

void StreamCapture::refuse_host_wait(const NpuStream& stream, const char* op) {
  // Rejected without invalidating the capture: Note [Capture-time refusals].
  TORCH_CHECK(false, c10::str("operation not permitted when stream is capturing: ", op, " waits on ", stream.name(),
      ", which an npu graph is capturing (no host synchronization or host read of device data is "
      "possible during capture)"));
}

void register_capture(StreamCapture* capture) {
  std::lock_guard<std::mutex> lock(g_captures_mutex);
  g_captures.push_back(capture);
  g_capture_count.fetch_add(1, std::memory_order_acq_rel);
}

void unregister_capture(const StreamCapture* capture) {
  std::lock_guard<std::mutex> lock(g_captures_mutex);
  auto it = std::find(g_captures.begin(), g_captures.end(), capture);
  if (it != g_captures.end()) {
    g_captures.erase(it);
    g_capture_count.fetch_sub(1, std::memory_order_acq_rel);
  }
}

bool with_capture(uint64_t id, const std::function<void(StreamCapture&)>& fn) {
  std::lock_guard<std::mutex> lock(g_captures_mutex);
  for (StreamCapture* capture : g_captures) {
    if (capture->id() == id) {
      fn(*capture);
      return true;
    }
  }
  return false;
}

void refuse_unsafe_call_during_capture(const char* op, const NpuStream* target, int waits_on_device) {
  if (g_capture_count.load(std::memory_order_acquire) == 0) {
    return;
  }
  if (target != nullptr) {
    // A wait on the captured stream itself is rejected, the capture left valid.
    TORCH_CHECK(target->capture() == nullptr, "operation not permitted when stream is capturing: ", op, " of ",
        target->name(), ", which an npu graph is capturing (its work runs only when the graph is replayed)");
  }
  std::lock_guard<std::mutex> lock(g_captures_mutex);
  for (StreamCapture* capture : g_captures) {
    const CaptureMode mode = capture->mode();
    // A device-wide synchronize of the capture's device waits on the captured
    // stream itself: every mode refuses that (synchronize_device), so the
    // message must not point to 'relaxed'.
    const int device = capture->origin().device();
    const bool waits_on_capture = waits_on_device == kAllDevices || waits_on_device == device;
    if (mode == CaptureMode::kGlobal ||
        (mode == CaptureMode::kThreadLocal && capture->thread() == std::this_thread::get_id())) {
      const std::string message = c10::str("operation not permitted when stream is capturing: ", op,
          " is a potentially unsafe call while an npu graph captures ", capture->origin().name(),
          " with capture_error_mode='", mode_name(mode), "' (refused ",
          mode == CaptureMode::kGlobal ? "from every thread" : "on the capturing thread",
          waits_on_capture
              ? c10::str("; no capture_error_mode allows it: it waits on npu:", device, ", whose stream is captured)")
              : std::string("; 'relaxed' allows it)"));
      // A wait on the capture's own device is a rejected stream synchronization.
      TORCH_CHECK(!waits_on_capture, message);
      capture->refuse(message);
    }
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
