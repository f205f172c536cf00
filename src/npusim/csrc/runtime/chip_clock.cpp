#include "chip_clock.h"

#include "trace.h"

#include <c10/util/ApproximateClock.h>

#include <time.h>

#include <algorithm>
#include <mutex>

namespace npusim {

// Note [Chip clock]
// With the timing model on, every figure npusim reports is the chip's, not
// this CPU's: each stream, the host and each collective comm stream keep a
// virtual time in microseconds, and nothing sleeps for the model (a task's
// kernel runs on the CPU at CPU speed, so values stay right).
//
// - A device task starts at the latest of its stream's clock (the end of the
//   task before it), the host's clock when it was issued, and the virtual
//   completion of what it waits on (an event's record, a collective); it
//   ends at its start plus its modelled duration (copy, compute, collective,
//   torch.npu._sleep). The stream worker computes this as it runs the task,
//   in stream order, so a task's times depend only on what it waits for, not
//   on when this machine ran it: the same program gives the same times in
//   every run and under any load of the machine.
// - The host's clock advances by the profile's per-launch host cost at each
//   launch of modelled work (host_launch_us, Note [Chip figures]), issuing
//   the work at the clock's value as the call begins, and jumps, at every
//   host wait (synchronize of a stream, a device or all; Event.synchronize;
//   .item() and every other host read; a blocking copy; a blocking
//   collective wait), to the virtual time of what it waited for. Event
//   records and stream waits cost the host nothing: they are not launches.
//   There is one host clock per process: the autograd engine runs backward
//   on its own device thread while the caller waits in backward(), so a
//   clock per thread would lose the backward pass; threads that launch at
//   the same time share it in the order their launches arrive.
// - Two host modes. "launch" (the default): the host costs only its
//   launches, so the figures show what the device does when the host keeps
//   up with it, and where the host cannot (small kernels: free time between
//   them), deterministically. It cannot show a program whose Python is the
//   bottleneck (a data loader, a Python loop between launches). "measured"
//   (host_cpu_factor > 0): each launch also adds the CPU time the launching
//   thread spent since its previous launch, scaled by the profile's host
//   factor, so Python-bound steps show as such; it counts npusim's own
//   dispatch work too (an upper bound on the host) and is not deterministic.
// - A host query (Stream.query, Event.query) answers in chip time: done when
//   the work's virtual end is not after the host's clock. So that the answer
//   never depends on this machine's speed, it first waits, in real time, for
//   the work to run (fast: nothing sleeps), and it costs the host a little
//   time (kHostQueryUs), so a polling loop ends.
// - A collective starts, on every rank, at the latest of its participants'
//   ready times: each rank's comm stream exchanges its ready time with the
//   others (a max all-reduce of one number over the group's own links) before
//   the collective runs, and the collective lasts the cost its algorithm
//   takes over the group's links (Note [Collective cost model]).
// - Event.elapsed_time is the chip time between the two records; the
//   profiler's device activities start and end at their chip times on the
//   profiler's own axis, and host ranges map onto it through samples of the
//   host's clock (anchor_profiler_axis).
// NPUSIM_TIMING's realtime=1 keeps the old behaviour as well: each task holds
// its stream for its modelled duration in real time, so that a test can see
// an ordering bug as a wrong value; the chip times are the same either way.

namespace {

constexpr double kHostQueryUs = 1.0;

std::atomic<bool> g_on{false};
std::atomic<bool> g_realtime{false};
std::atomic<double> g_host_launch_us{0.0};
std::atomic<double> g_host_cpu_factor{0.0};
std::atomic<double> g_host_clock{0.0};

thread_local TaskClock* tls_task_clock = nullptr;
thread_local double tls_last_cpu_us = -1.0;

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// ---- the profiler's axis
// The host clock's samples are stamped with the clock the profiler stamps
// host events with (c10::getApproximateTime) and converted to nanoseconds
// as it converts them: by an ApproximateClockToUnixTimeConverter started with
// the recording, finished when the samples are read. Stamped with
// c10::getTime instead, a sample and a host event taken microseconds apart
// could swap order on the axis (the converted approximate clock and getTime
// differed by up to 68 us within a second on this project's VM).
std::mutex& g_axis_mutex = *new std::mutex();
int64_t g_anchor_ns = 0;
double g_anchor_chip_us = 0.0;
c10::ApproximateClockToUnixTimeConverter* g_axis_converter = nullptr;
std::vector<std::pair<c10::approx_time_t, double>>& g_samples =
    *new std::vector<std::pair<c10::approx_time_t, double>>();

// Moves the host clock to max(clock, at_least) or on by `us`; returns the old
// value. While a recording that began on the chip clock goes on, the move is
// sampled, stamped before the new value can be seen: a host range that ends
// after another thread's move ends after that move's sample too, even when
// this thread found the clock moved already and made no sample of its own
// (stamped after the move, a descheduled thread's sample could land after
// such a range's end, which then mapped to the clock before the move: a race
// found reading this code while chasing test_timeline's flake, not one seen
// in a trace). The lock keeps the samples in stamp order.
double advance_host(double us, double at_least) {
  std::unique_lock<std::mutex> lock(g_axis_mutex, std::defer_lock);
  c10::approx_time_t stamp{};
  const bool sampled = recording_device_activities();
  if (sampled) {
    lock.lock();
    stamp = c10::getApproximateTime();
  }
  double old = g_host_clock.load(std::memory_order_acquire);
  double next = 0.0;
  do {
    next = std::max(old + us, at_least);
    if (next == old) {
      return old;
    }
  } while (!g_host_clock.compare_exchange_weak(old, next, std::memory_order_acq_rel));
  if (sampled && !g_samples.empty()) {
    g_samples.emplace_back(stamp, next);
  }
  return old;
}

}  // namespace

void set_chip_clock(const ChipClockSettings& settings) {
  g_realtime.store(settings.realtime, std::memory_order_release);
  g_host_launch_us.store(settings.host_launch_us, std::memory_order_release);
  g_host_cpu_factor.store(settings.host_cpu_factor, std::memory_order_release);
  g_on.store(settings.on, std::memory_order_release);
}

ChipClockSettings chip_clock_settings() {
  return ChipClockSettings{g_on.load(), g_realtime.load(), g_host_launch_us.load(), g_host_cpu_factor.load()};
}

bool chip_clock_on() {
  return g_on.load(std::memory_order_acquire);
}

bool realtime_timing() {
  return g_realtime.load(std::memory_order_acquire);
}

double host_clock_us() {
  return g_host_clock.load(std::memory_order_acquire);
}

double host_launch() {
  double cost = g_host_launch_us.load(std::memory_order_relaxed);
  const double factor = g_host_cpu_factor.load(std::memory_order_relaxed);
  if (factor > 0) {
    const double now = thread_cpu_us();
    if (tls_last_cpu_us >= 0) {
      cost += factor * (now - tls_last_cpu_us);
    }
    tls_last_cpu_us = now;
  }
  return advance_host(cost, 0.0);
}

void host_wait_until(double chip_us) {
  advance_host(0.0, chip_us);
}

void host_query() {
  advance_host(kHostQueryUs, 0.0);
}

TaskClock::TaskClock(double start_us) : now_us_(start_us), outer_(tls_task_clock) {
  tls_task_clock = this;
}

TaskClock::~TaskClock() {
  tls_task_clock = outer_;
}

void TaskClock::wait_until(double chip_us) {
  now_us_ = std::max(now_us_, chip_us);
}

TaskClock* current_task_clock() {
  return tls_task_clock;
}

void task_wait_until(double chip_us) {
  if (TaskClock* clock = tls_task_clock) {
    clock->wait_until(chip_us);
  }
}

double task_or_host_now() {
  const TaskClock* clock = tls_task_clock;
  return clock != nullptr ? clock->now() : host_clock_us();
}

namespace {
thread_local bool tls_span_noted = false;
thread_local double tls_span_start_us = 0.0;
thread_local double tls_span_end_us = 0.0;
}  // namespace

void note_task_span(double start_us, double end_us) {
  tls_span_noted = true;
  tls_span_start_us = start_us;
  tls_span_end_us = end_us;
}

bool take_task_span(double* start_us, double* end_us) {
  if (!tls_span_noted) {
    return false;
  }
  tls_span_noted = false;
  *start_us = tls_span_start_us;
  *end_us = tls_span_end_us;
  return true;
}

void forget_task_span() {
  tls_span_noted = false;
}

void anchor_profiler_axis() {
  std::lock_guard<std::mutex> lock(g_axis_mutex);
  delete g_axis_converter;
  g_axis_converter = new c10::ApproximateClockToUnixTimeConverter();  // measures its start pairs
  g_anchor_ns = c10::getTime();
  g_anchor_chip_us = host_clock_us();
  g_samples.clear();
  if (chip_clock_on()) {
    g_samples.emplace_back(c10::getApproximateTime(), g_anchor_chip_us);
  }
}

int64_t chip_us_to_profiler_ns(double chip_us) {
  std::lock_guard<std::mutex> lock(g_axis_mutex);
  return g_anchor_ns + static_cast<int64_t>((chip_us - g_anchor_chip_us) * 1e3);
}

std::vector<std::pair<int64_t, double>> host_clock_samples() {
  std::lock_guard<std::mutex> lock(g_axis_mutex);
  std::vector<std::pair<int64_t, double>> samples;
  if (g_samples.empty()) {
    return samples;
  }
  const auto to_ns = g_axis_converter->makeConverter();  // measures its end pairs now
  samples.reserve(g_samples.size());
  for (const auto& [approx, chip_us] : g_samples) {
    // The converter maps a time before its start pairs to 0; no sample is (the first is taken after).
    const int64_t ns = to_ns(approx);
    samples.emplace_back(ns > 0 ? ns : g_anchor_ns, chip_us);
  }
  return samples;
}

std::pair<int64_t, double> profiler_axis_anchor() {
  std::lock_guard<std::mutex> lock(g_axis_mutex);
  return {g_anchor_ns, g_anchor_chip_us};
}

}  // namespace npusim
