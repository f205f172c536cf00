#include "timing.h"

namespace npusim {

TimingModel& timing_model() {
  static TimingModel model;
  return model;
}

namespace {
// 1 GB/s moves 1e9 bytes per 1e6 microseconds.
double task_us(size_t bytes, double gbps) {
  return timing_model().launch_us.load() + (gbps > 0 ? static_cast<double>(bytes) / (gbps * 1e3) : 0.0);
}
}  // namespace

double copy_task_us(size_t bytes) {
  return task_us(bytes, timing_model().copy_gbps.load());
}

double link_task_us(size_t bytes) {
  return task_us(bytes, timing_model().link_gbps.load());
}

}  // namespace npusim
