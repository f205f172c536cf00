// The chip's clock: the virtual time of every stream, the host and each
// collective while the timing model is on. See Note [Chip clock] in
// chip_clock.cpp and runtime/timing.py.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

namespace npusim {

// Settings the timing model gives the clock (runtime/timing.py sets them).
struct ChipClockSettings {
  bool on = false;  // the timing model is on: times are the chip's
  // Tasks also hold their stream for their modelled duration in real time
  // (the timing model before the chip clock): for tests that need ordering
  // bugs to be observable, never for figures.
  bool realtime = false;
  double host_launch_us = 0.0;  // host time one launch costs (the profile's figure)
  // > 0: the host's measured CPU time between launches, scaled by this
  // factor, is added to its clock (Note [Chip clock]: the two host modes).
  double host_cpu_factor = 0.0;
};
void set_chip_clock(const ChipClockSettings& settings);
ChipClockSettings chip_clock_settings();

// One load each.
bool chip_clock_on();
bool realtime_timing();

// ---- the host's clock (one per process) ------------------------------------

double host_clock_us();
// A launch of modelled work: returns its issue time (the host's clock as the
// call begins) and advances the host by the launch's cost.
double host_launch();
// A host wait for something that completes at `chip_us`: the host's clock
// jumps there if it is behind.
void host_wait_until(double chip_us);
// A host query of the device (Stream.query, Event.query): a little host time.
void host_query();

// ---- the clock of the task a thread runs (stream workers, comm threads) ----

// Set while a thread runs a task on the chip clock: its virtual start, which
// the task moves on as it waits (an event, a collective) or runs replayed work.
class TaskClock {
 public:
  explicit TaskClock(double start_us);
  ~TaskClock();
  TaskClock(const TaskClock&) = delete;
  TaskClock& operator=(const TaskClock&) = delete;
  double now() const { return now_us_; }
  void advance(double us) { now_us_ += us; }
  void wait_until(double chip_us);

 private:
  double now_us_;
  TaskClock* outer_;
};
// The innermost task clock of this thread, or null.
TaskClock* current_task_clock();
// A task's own wait for something that completes at `chip_us` (no-op off a task).
void task_wait_until(double chip_us);
// The chip time a task running now has reached; the host's clock off a task.
double task_or_host_now();

// The chip times of the task this thread has just run, for its profiler
// activity: noted by the runner, taken (once) by run_profiled.
void note_task_span(double start_us, double end_us);
bool take_task_span(double* start_us, double* end_us);
void forget_task_span();

// ---- the profiler's time axis ---------------------------------------------

// While device activities are recorded, chip times are placed on the
// profiler's axis (nanoseconds of c10::getTime) from an anchor taken when the
// recording starts, and the host's clock is sampled at each change so that
// host ranges can be mapped onto the same axis (npusim/runtime/chip_clock.py).
void anchor_profiler_axis();
int64_t chip_us_to_profiler_ns(double chip_us);
// (profiler ns, host chip us) at each change of the host's clock while
// recording, stamped with the profiler's own clock and converted as it
// converts its events (chip_clock.cpp), so that samples and host events keep
// their order on the axis.
std::vector<std::pair<int64_t, double>> host_clock_samples();
std::pair<int64_t, double> profiler_axis_anchor();

}  // namespace npusim
