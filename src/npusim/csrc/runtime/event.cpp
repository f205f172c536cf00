#include "event.h"

#include "host_wait.h"

#include <c10/util/Exception.h>

namespace npusim {

namespace {

std::shared_ptr<EventRecord> new_record(NpuEvent& event, const NpuStream& stream) {
  TORCH_CHECK(event.device < 0 || event.device == stream.device(),
      "Event device npu:", static_cast<int>(event.device),
      " does not match recording stream's device npu:", static_cast<int>(stream.device()));
  event.device = stream.device();
  auto record = std::make_shared<EventRecord>();
  event.record = record;
  return record;
}

// A signal: it runs on a failed stream too, and carries the failure on
// (Note [Errors of asynchronous work]).
std::function<void()> complete_record(std::shared_ptr<EventRecord> record, const NpuStream& stream) {
  return [record = std::move(record), &stream] {
    std::string error = stream.failure();
    {
      std::lock_guard<std::mutex> lock(record->mutex);
      record->done = true;
      record->when = std::chrono::steady_clock::now();
      record->error = std::move(error);
    }
    record->cv.notify_all();
  };
}

void record_now(EventRecord& record) {
  record.done = true;  // no other thread has this record yet
  record.when = std::chrono::steady_clock::now();
}

}  // namespace

void event_record(NpuEvent& event, NpuStream& stream) {
  auto record = new_record(event, stream);
  if (done_on_the_host_now(stream)) {  // Note [Work on an idle stream]
    record_now(*record);
    return;
  }
  stream.enqueue(complete_record(std::move(record), stream), 0.0, "event_record", TaskKind::kSignal);
}

void event_record_unobserved(NpuEvent& event, NpuStream& stream) {
  auto record = new_record(event, stream);
  if ((stream.query() && !stream.failed()) || stream.capture() != nullptr) {
    record_now(*record);  // a capture's replay needs no profiler marker
    return;
  }
  stream.enqueue_unobserved(complete_record(std::move(record), stream), "event_record");
}

void stream_wait_event(NpuStream& stream, const NpuEvent& event) {
  auto record = event.record;
  if (!record) {
    return;  // never recorded: nothing to wait for (CUDA semantics)
  }
  if (!tasks_must_show(stream)) {
    std::lock_guard<std::mutex> lock(record->mutex);
    if (record->done && record->error.empty()) {
      return;  // Note [Work on an idle stream]
    }
  }
  stream.enqueue([record, &stream] {
    std::unique_lock<std::mutex> lock(record->mutex);
    record->cv.wait(lock, [&] { return record->done; });
    if (!record->error.empty()) {
      // See Note [Errors of asynchronous work]: the failure follows the dependency.
      stream.fail("wait_event failed: the event was recorded after a failure (" + record->error + ")");
    }
  }, 0.0, "wait_event");
}

bool event_query(const NpuEvent& event) {
  auto record = event.record;
  if (!record) {
    return true;
  }
  std::lock_guard<std::mutex> lock(record->mutex);
  return record->done;
}

void event_synchronize(const NpuEvent& event) {
  auto record = event.record;
  if (!record) {
    return;
  }
  std::unique_lock<std::mutex> lock(record->mutex);
  wait_on_host(record->cv, lock, -1.0, [&] { return record->done; });  // Note [Interruptible host waits]
  TORCH_CHECK(record->error.empty(), "npusim: event synchronize: the event was recorded on npu:",
      static_cast<int>(event.device), " after asynchronous work failed: ", record->error);
}

double event_elapsed_ms(const NpuEvent& start, const NpuEvent& end) {
  TORCH_CHECK(start.enable_timing && end.enable_timing,
      "elapsed_time: both events must be created with enable_timing=True");
  TORCH_CHECK(start.record && end.record,
      "elapsed_time: both events must be recorded before calculating elapsed time");
  TORCH_CHECK(start.device == end.device,
      "elapsed_time: both events must be recorded on the same device, got npu:",
      static_cast<int>(start.device), " and npu:", static_cast<int>(end.device));
  TORCH_CHECK(event_query(start) && event_query(end),
      "elapsed_time: both events must have completed; synchronize them first");
  return std::chrono::duration<double, std::milli>(end.record->when - start.record->when).count();
}

void stream_wait_stream(NpuStream& waiter, NpuStream& target) {
  if (&waiter == &target || target.query()) {
    return;
  }
  NpuEvent event;
  event_record(event, target);
  stream_wait_event(waiter, event);
}

}  // namespace npusim
