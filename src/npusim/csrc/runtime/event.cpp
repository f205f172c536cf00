#include "event.h"

#include "host_wait.h"

#include <c10/util/Exception.h>

namespace npusim {
namespace {

// CUDA's cudaErrorCapturedEvent, for a host call on an event recorded during
// capture; the capture stays valid (Note [Capture-time refusals]).
[[noreturn]] void refuse_captured_event(const EventRecord& record, const char* op) {
  const std::string message = c10::str("operation not permitted on an event last recorded in a capturing stream: ",
      op, " of an event recorded during an npu graph capture (its record runs only when the graph is replayed)");
  const bool underway = with_capture(record.capture_id, [](StreamCapture&) {});
  TORCH_CHECK(!underway, message);
  TORCH_CHECK(false, message, "; that capture has ended: record the event again outside the capture");
}

// `stream` waits on a record node of a capture: it joins that capture, or, in it
// already, depends on the node. See Note [Multi-stream capture].
void wait_on_captured_record(NpuStream& stream, const EventRecord& record) {
  StreamCapture* const own = stream.capture();
  const bool underway = with_capture(record.capture_id, [&](StreamCapture& capture) {
    if (own != nullptr && own != &capture) {
      own->refuse(c10::str("operation would result in a merge of separate capture sequences: ", stream.name(),
          ", captured by one npu graph, waits on an event recorded during the capture of ",
          capture.origin().name(), " by another"));
    }
    capture.wait_event(stream, record.capture_node);
  });
  TORCH_CHECK(underway, "operation not permitted on an event last recorded in a capturing stream: ", stream.name(),
      " waits on an event recorded during an npu graph capture that has ended; record it again outside the capture");
}

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
      record->on_chip_clock = chip_clock_on();
      record->chip_us = task_or_host_now();
      record->error = std::move(error);
    }
    record->cv.notify_all();
  };
}

void record_now(EventRecord& record, const NpuStream& stream) {
  record.done = true;  // no other thread has this record yet
  record.when = std::chrono::steady_clock::now();
  record.on_chip_clock = chip_clock_on();
  record.chip_us = std::max(stream.clock_us(), host_clock_us());  // an idle stream reaches it at issue
}

}  // namespace

void event_record(NpuEvent& event, NpuStream& stream) {
  auto record = new_record(event, stream);
  if (StreamCapture* capture = stream.capture()) {
    // A node of the graph, not a task: see Note [Multi-stream capture].
    record->capture_id = capture->id();
    record->capture_node = capture->record_event(stream);
    return;
  }
  if (done_on_the_host_now(stream)) {  // Note [Work on an idle stream]
    record_now(*record, stream);
    return;
  }
  stream.enqueue(complete_record(std::move(record), stream), 0.0, "event_record", TaskKind::kSignal);
}

void event_record_unobserved(NpuEvent& event, NpuStream& stream) {
  auto record = new_record(event, stream);
  if ((stream.query() && !stream.failed()) || stream.capture() != nullptr) {
    record_now(*record, stream);  // a capture's replay needs no profiler marker
    return;
  }
  stream.enqueue_unobserved(complete_record(std::move(record), stream), "event_record");
}

void stream_wait_event(NpuStream& stream, const NpuEvent& event) {
  auto record = event.record;
  if (!record) {
    return;  // never recorded: nothing to wait for (CUDA semantics)
  }
  if (record->capture_id != 0) {
    wait_on_captured_record(stream, *record);
    return;
  }
  if (StreamCapture* capture = stream.capture()) {
    {
      std::lock_guard<std::mutex> lock(record->mutex);
      if (record->done) {
        return;  // finished work: no dependency to capture
      }
    }
    capture->refuse(c10::str("dependency created on uncaptured work in another stream: ", stream.name(),
        ", which an npu graph is capturing, waits on an event recorded outside the capture that has not "
        "completed; make the capturing stream wait for that work before capture_begin"));
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
    if (record->on_chip_clock) {
      task_wait_until(record->chip_us);  // Note [Chip clock]
    }
    if (!record->error.empty()) {
      // See Note [Errors of asynchronous work]: the failure follows the dependency.
      stream.fail("wait_event failed: the event was recorded after a failure (" + record->error + ")");
    }
  }, 0.0, "wait_event", TaskKind::kWait);
}

namespace {
// Whether the stream has reached the event's record: under the chip clock in
// chip time (it first waits, in real time, for the record to run, so that the
// answer never depends on this machine's speed; Note [Chip clock]), which a
// user's query pays for with a little host time (charge_host) and reading a
// time (elapsed_time) does not. `call` names the caller in refusals.
bool query_event(const NpuEvent& event, const char* call, bool charge_host) {
  auto record = event.record;
  if (record && record->capture_id != 0) {
    refuse_captured_event(*record, call);
  }
  refuse_unsafe_call_during_capture(call, nullptr);
  if (event.device >= 0 && device_failed(event.device)) {
    raise_device_failure(event.device, call);  // Note [Sticky device errors]
  }
  if (!record) {
    return true;
  }
  if (chip_clock_on() && !realtime_timing()) {
    double chip_us = 0.0;
    {
      std::unique_lock<std::mutex> lock(record->mutex);
      wait_on_host(record->cv, lock, -1.0, [&] { return record->done; });  // Note [Interruptible host waits]
      chip_us = record->chip_us;
    }
    if (charge_host) {
      host_query();
    }
    return chip_us <= host_clock_us();
  }
  std::lock_guard<std::mutex> lock(record->mutex);
  return record->done;
}
}  // namespace

bool event_query(const NpuEvent& event) {
  return query_event(event, "Event.query", /*charge_host=*/true);
}

void event_synchronize(const NpuEvent& event) {
  auto record = event.record;
  if (record && record->capture_id != 0) {
    refuse_captured_event(*record, "Event.synchronize");
  }
  refuse_unsafe_call_during_capture("Event.synchronize", nullptr);
  if (!record) {
    return;
  }
  {
    std::unique_lock<std::mutex> lock(record->mutex);
    wait_on_host(record->cv, lock, -1.0, [&] { return record->done; });  // Note [Interruptible host waits]
  }
  stop_thread_if_exiting();  // Note [Launches at exit]
  if (device_failed(event.device)) {
    raise_device_failure(event.device, "Event.synchronize");  // Note [Sticky device errors]
  }
  if (record->on_chip_clock) {
    host_wait_until(record->chip_us);  // Note [Chip clock]
  }
}

double event_elapsed_ms(const NpuEvent& start, const NpuEvent& end) {
  TORCH_CHECK(start.enable_timing && end.enable_timing,
      "elapsed_time: both events must be created with enable_timing=True");
  TORCH_CHECK(start.record && end.record,
      "elapsed_time: both events must be recorded before calculating elapsed time");
  for (const NpuEvent* e : {&start, &end}) {
    if (e->record->capture_id != 0) {
      refuse_captured_event(*e->record, "Event.elapsed_time");
    }
  }
  TORCH_CHECK(start.device == end.device,
      "elapsed_time: both events must be recorded on the same device, got npu:",
      static_cast<int>(start.device), " and npu:", static_cast<int>(end.device));
  TORCH_CHECK(query_event(start, "Event.elapsed_time", /*charge_host=*/false) &&
      query_event(end, "Event.elapsed_time", /*charge_host=*/false),
      "elapsed_time: both events must have completed; synchronize them first");
  if (start.record->on_chip_clock && end.record->on_chip_clock) {
    return (end.record->chip_us - start.record->chip_us) / 1e3;  // Note [Chip clock]
  }
  return std::chrono::duration<double, std::milli>(end.record->when - start.record->when).count();
}

void stream_wait_stream(NpuStream& waiter, NpuStream& target) {
  // A captured target's query() says idle (its tasks are recorded, not queued),
  // yet the wait is the dependency the capture needs: a fork or a join.
  // Under the chip clock an idle target's work still ends at a chip time the waiter must wait for.
  if (&waiter == &target || (target.capture() == nullptr && target.query() && !chip_clock_on())) {
    return;
  }
  NpuEvent event;
  event_record(event, target);
  stream_wait_event(waiter, event);
}

}  // namespace npusim
