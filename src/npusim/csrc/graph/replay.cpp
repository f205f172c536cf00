// Replay of a captured npu graph: the origin's lane on the replay stream, the
// other lanes on the device's replay lane streams, ordered by their records
// and waits.
#include "replay.h"

#include "replay_levels.h"
#include "../runtime/chip_clock.h"
#include "../runtime/device.h"
#include "../runtime/subnormals.h"

#include <ATen/ThreadLocalState.h>
#include <c10/util/Exception.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <optional>
#include <thread>

namespace npusim {

// Note [Replaying the lanes]
// A replay enqueues the origin's lane as ONE task on the current stream (so
// the host cost of a replay does not grow with the number of ops, and the
// graph runs after the stream's earlier work, asynchronously to the host), and
// every other lane as one task on a replay lane stream of the device: streams
// of their own, with their own workers, so that lanes captured in parallel run
// in parallel (under the timing model two lanes' modelled durations overlap)
// and a replay never queues behind the user's work on the streams it was
// captured from. Within a replay each record node is a flag its lane raises
// and each wait node blocks its lane until the flag is up; the flags are the
// replay's own, so replays in flight do not see each other's records. Every
// lane joined back to the origin's (Note [Multi-stream capture]), so the
// replay stream's task completes only after all the graph's work: a
// synchronize of the replay stream, an event recorded after the replay and the
// stream-ordered frees see the whole graph. A task that fails stops the replay:
// every flag is raised so no lane waits for ever, and the origin's task fails
// with that error (reported by the replay stream, as asynchronous failures
// are). Under NPUSIM_LAUNCH_BLOCKING=1 a replay is one blocking launch, as
// cudaGraphLaunch is under CUDA_LAUNCH_BLOCKING: the host waits for the origin's
// task, and so for the whole graph, and a failure raises from replay() itself;
// the lanes still run in parallel (a launch blocks the host, not the graph's
// branches), so the side lanes are enqueued without blocking (enqueue_joined:
// they wait on the origin's task, which is enqueued after them).

namespace {

// The record flags of one replay.
class ReplayRun {
 public:
  explicit ReplayRun(size_t num_records) : done_(num_records, 0), chip_us_(num_records, 0.0) {}

  // Raised at the lane's chip time (Note [Chip clock]).
  void complete(size_t record) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_[record] = 1;
      chip_us_[record] = task_or_host_now();
    }
    cv_.notify_all();
  }
  // False when the replay failed (no work may follow); the lane's chip clock
  // waits for the record's.
  bool wait(size_t record) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done_[record] != 0; });
    task_wait_until(chip_us_[record]);
    return error_.empty();
  }
  void fail(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error_.empty()) {
        error_ = message;
      }
      std::fill(done_.begin(), done_.end(), 1);
    }
    cv_.notify_all();
  }
  std::string error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<char> done_;
  std::vector<double> chip_us_;
  std::string error_;
};

void run_task(const GraphTask& task) {
  // The timing model's duration, as on a stream: on the chip clock of the
  // replay's task (Note [Chip clock]), and in real time when realtime.
  if (task.duration_us > 0 && (realtime_timing() || !chip_clock_on())) {
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double, std::micro>(task.duration_us)));
  }
  task.fn();
  if (TaskClock* clock = current_task_clock()) {
    clock->advance(task.duration_us);
  }
}

// A single lane's levels, each level's tasks at once when it has several
// (Note [Replaying independent tasks at once]); no realtime timing.
void run_levels(const CapturedGraph& graph) {
  const std::vector<GraphTask>& tasks = graph.lanes[0].tasks;
  // What a helping host runs a task under: the worker's thread-local state,
  // not the waiting user's (grad mode, dispatch keys, Python modes).
  std::optional<at::ThreadLocalState> worker_state;
  const std::thread::id worker = std::this_thread::get_id();
  for (const std::vector<uint32_t>& level : graph.levels) {
    if (level.size() == 1) {
      run_task(tasks[level[0]]);
      continue;
    }
    if (!worker_state) {
      worker_state.emplace();
    }
    NpuStream::run_shared(static_cast<int64_t>(level.size()), 1, [&](int64_t begin, int64_t end) {
      std::optional<at::ThreadLocalStateGuard> state;
      if (std::this_thread::get_id() != worker) {
        state.emplace(*worker_state);
      }
      for (int64_t i = begin; i < end; ++i) {
        tasks[level[static_cast<size_t>(i)]].fn();
      }
    });
    if (TaskClock* clock = current_task_clock()) {
      for (const uint32_t t : level) {
        clock->advance(tasks[t].duration_us);  // the chip runs them one at a time
      }
    }
  }
}

void run_lane(const GraphLane& lane, ReplayRun& run) {
  try {
    for (const GraphTask& task : lane.tasks) {
      switch (task.kind) {
        case GraphTask::Kind::kRun:
          run_task(task);
          break;
        case GraphTask::Kind::kRecord:
          run.complete(task.record);
          break;
        case GraphTask::Kind::kWait:
          if (!run.wait(task.record)) {
            return;
          }
          break;
      }
    }
  } catch (const c10::Error& e) {
    run.fail(c10::str(e.what_without_backtrace(), " (in the replayed lane of ", lane.stream->name(), ")"));
  } catch (const std::exception& e) {
    run.fail(c10::str(e.what(), " (in the replayed lane of ", lane.stream->name(), ")"));
  }
}

// The replay lane streams of each device: leaked, as the device's streams are
// (their workers may run while static destructors do).
NpuStream& replay_lane_stream(c10::DeviceIndex device, size_t lane) {
  static std::mutex& mutex = *new std::mutex();
  static auto& lanes = *new std::array<std::vector<NpuStream*>, kMaxDevices>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& streams = lanes[device];
  while (streams.size() < lane) {
    // Ids after the device's own streams: they name the lane in traces and errors.
    const auto id = static_cast<c10::StreamId>(kStreamsPerDevice + streams.size());
    streams.push_back(new NpuStream(device, id, 0));
  }
  return *streams[lane - 1];
}

}  // namespace

size_t CapturedGraph::num_tasks() const {
  return issue_order.size();
}

std::shared_ptr<const CapturedGraph> make_captured_graph(c10::DeviceIndex device, std::vector<GraphLane> lanes,
    size_t num_records, std::vector<std::pair<size_t, size_t>> issue_order) {
  auto graph = std::make_shared<CapturedGraph>();
  graph->device = device;
  graph->lanes = std::move(lanes);
  graph->num_records = num_records;
  graph->issue_order = std::move(issue_order);
  if (graph->lanes.size() == 1) {
    graph->levels = independent_levels(graph->lanes[0].tasks);
  }
  return graph;
}

void enqueue_replay(const std::shared_ptr<const CapturedGraph>& graph, NpuStream& stream,
    std::vector<std::function<void()>> prologue) {
  if (graph->lanes.size() == 1) {
    stream.enqueue([graph, prologue = std::move(prologue)] {
      for (const auto& fn : prologue) {
        fn();
      }
      if (!graph->levels.empty() && !realtime_timing()) {
        run_levels(*graph);
        return;
      }
      for (const auto& [lane, index] : graph->issue_order) {
        const GraphTask& task = graph->lanes[lane].tasks[index];
        if (task.kind == GraphTask::Kind::kRun) {
          run_task(task);
        }
      }
    }, 0.0, "graph_replay");
    return;
  }
  auto run = std::make_shared<ReplayRun>(graph->num_records);
  // The side lanes first: each waits (on its first wait node) for the origin's lane.
  for (size_t l = 1; l < graph->lanes.size(); ++l) {
    replay_lane_stream(graph->device, l).enqueue_joined(
        [graph, run, l] { run_lane(graph->lanes[l], *run); }, "graph_replay_lane");
  }
  try {
    stream.enqueue([graph, run, prologue = std::move(prologue)] {
      try {
        for (const auto& fn : prologue) {
          fn();
        }
      } catch (const std::exception& e) {
        run->fail(e.what());
      }
      run_lane(graph->lanes[0], *run);
      const std::string error = run->error();
      TORCH_CHECK(error.empty(), error);
    }, 0.0, "graph_replay");
  } catch (...) {
    // The origin's launch was refused (a failed device, an interrupted wait
    // for a launch slot): the side lanes already queued must not wait for it.
    run->fail("the replay's launch on " + stream.name() + " was refused");
    throw;
  }
}

}  // namespace npusim
