// Events of the simulated NPU: a record marks a point of a stream, waits and
// host synchronizations wait for it (CUDA's event semantics).
#pragma once

#include "stream.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

namespace npusim {

struct EventRecord {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::chrono::steady_clock::time_point when;
  // Under the chip clock: the chip time the stream reached the record (Note [Chip clock]).
  bool on_chip_clock = false;
  double chip_us = 0.0;
  // Nonzero: recorded into that capture, as its record node capture_node; such a
  // record never completes on the host (Note [Multi-stream capture]).
  uint64_t capture_id = 0;
  uint64_t capture_node = 0;
  // The recording stream's failure when the record ran (Note [Errors of
  // asynchronous work]): waits for the event fail, its synchronize raises it.
  std::string error;
};

// A recorded event points at the record of its latest record() call; waiting
// streams capture that record, so re-recording never releases old waiters.
struct NpuEvent {
  bool enable_timing = false;
  c10::DeviceIndex device = -1;
  std::shared_ptr<EventRecord> record;
};

void event_record(NpuEvent& event, NpuStream& stream);
// A record no observer sees, never captured: the profiler's timing markers.
void event_record_unobserved(NpuEvent& event, NpuStream& stream);
void stream_wait_event(NpuStream& stream, const NpuEvent& event);
// The user's query and synchronize (the device guard's hooks): refused, as on
// CUDA, for an event recorded during a capture and by an underway capture's
// mode (Note [Capture-time refusals]).
bool event_query(const NpuEvent& event);
void event_synchronize(const NpuEvent& event);
double event_elapsed_ms(const NpuEvent& start, const NpuEvent& end);
// Makes `waiter` wait for everything enqueued on `target` so far.
void stream_wait_stream(NpuStream& waiter, NpuStream& target);

}  // namespace npusim
