// The timing model: how long a device task takes on its stream. See
// runtime/timing.py (Python's TimingModel, the same fields and units).
#pragma once

#include <atomic>
#include <cstddef>

namespace npusim {

// All zero (off) by default: tasks then take as long as the host work does.
struct TimingModel {
  std::atomic<double> copy_gbps{0.0};  // device copy bandwidth, GB/s
  std::atomic<double> launch_us{0.0};  // latency of each device task, microseconds
  std::atomic<double> link_gbps{0.0};  // collective / cross-device link bandwidth, GB/s
};
TimingModel& timing_model();
double copy_task_us(size_t bytes);
double link_task_us(size_t bytes);

}  // namespace npusim
