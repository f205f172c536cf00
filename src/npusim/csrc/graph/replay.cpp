// Replay of a captured npu graph: the origin's lane on the replay stream, the
// other lanes on the device's replay lane streams, ordered by their records
// and waits.
#include "replay.h"

#include "../runtime/chip_clock.h"
#include "../runtime/device.h"
#include "../runtime/host_wait.h"

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

// One replay of a single lane's DAG: its tasks' countdowns and the ready ones
// (Note [Replaying independent tasks at once]).
class DagRun {
 public:
  DagRun(const ReplayDag& dag, const std::vector<GraphTask>& tasks)
      : dag_(dag), tasks_(tasks), pending_(new std::atomic<int32_t>[dag.tasks.size()]),
        remaining_(static_cast<int64_t>(dag.tasks.size())) {
    for (size_t p = 0; p < dag.tasks.size(); ++p) {
      pending_[p].store(dag.predecessors[p], std::memory_order_relaxed);
      if (dag.predecessors[p] == 0) {
        ready_.push_back(static_cast<int32_t>(p));
      }
    }
    num_ready_.store(static_cast<int64_t>(ready_.size()));
  }

  // Runs ready tasks until every task has run or one has failed (its error
  // propagates). Only `worker` runs the tasks of unknown access.
  void take_part(bool worker) {
    int32_t next = -1;
    for (int spins = 1;; ++spins) {
      if (next < 0) {
        next = take(worker);
      }
      if (next < 0) {
        if (remaining_.load(std::memory_order_acquire) == 0 || failed_.load(std::memory_order_acquire)) {
          return;
        }
        cpu_relax();
        if (spins % 64 == 0) {
          std::this_thread::yield();
        }
        continue;
      }
      try {
        tasks_[dag_.tasks[static_cast<size_t>(next)]].fn();
      } catch (...) {
        failed_.store(true, std::memory_order_release);
        throw;
      }
      next = release_successors(next, worker);
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

 private:
  // Counts `done` down in its successors; returns the one this thread goes on
  // with (the longest path to the end among those it made ready and may run),
  // or -1, and leaves the others to be taken.
  int32_t release_successors(int32_t done, bool worker) {
    int32_t keep = -1;
    for (const uint32_t s : dag_.successors[static_cast<size_t>(done)]) {
      if (pending_[s].fetch_sub(1, std::memory_order_acq_rel) != 1) {
        continue;  // it still waits for another task
      }
      const auto ready = static_cast<int32_t>(s);
      if (may_run(s, worker) && (keep < 0 || dag_.height[s] > dag_.height[static_cast<size_t>(keep)])) {
        if (keep >= 0) {
          push(keep);
        }
        keep = ready;
      } else {
        push(ready);
      }
    }
    return keep;
  }

  // Whether the calling thread (the worker or a helping host) may run task `t`.
  bool may_run(size_t t, bool worker) const {
    return worker || dag_.worker_only[t] == 0;
  }

  void push(int32_t task) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ready_.push_back(task);
    num_ready_.fetch_add(1, std::memory_order_release);
  }

  // A ready task this thread may run, the one with the longest path to the
  // end, or -1.
  int32_t take(bool worker) {
    if (num_ready_.load(std::memory_order_acquire) == 0) {
      return -1;
    }
    const std::lock_guard<std::mutex> lock(mutex_);
    size_t best = ready_.size();
    for (size_t i = 0; i < ready_.size(); ++i) {
      const auto t = static_cast<size_t>(ready_[i]);
      if (may_run(t, worker) &&
          (best == ready_.size() || dag_.height[t] > dag_.height[static_cast<size_t>(ready_[best])])) {
        best = i;
      }
    }
    if (best == ready_.size()) {
      return -1;
    }
    const int32_t task = ready_[best];
    ready_.erase(ready_.begin() + static_cast<std::ptrdiff_t>(best));
    num_ready_.fetch_sub(1, std::memory_order_release);
    return task;
  }

  const ReplayDag& dag_;
  const std::vector<GraphTask>& tasks_;
  std::unique_ptr<std::atomic<int32_t>[]> pending_;
  std::atomic<int64_t> remaining_;
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::vector<int32_t> ready_;
  std::atomic<int64_t> num_ready_{0};
};

// A single lane's DAG, run by the stream worker and a host that waits for
// the stream (Note [Replaying independent tasks at once]); no realtime timing.
void run_dag(const CapturedGraph& graph) {
  DagRun run(graph.dag, graph.lanes[0].tasks);
  const std::thread::id worker = std::this_thread::get_id();
  // Two parts: the worker takes the first (and the second, if no host came).
  NpuStream::run_shared_as_worker(2, 1, [&](int64_t, int64_t) {
    run.take_part(std::this_thread::get_id() == worker);
  });
  if (TaskClock* clock = current_task_clock()) {
    clock->advance(graph.dag.duration_us);  // the chip runs them one at a time
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
    graph->dag = independent_tasks(graph->lanes[0].tasks);
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
      if (!graph->dag.empty() && !realtime_timing()) {
        run_dag(*graph);
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
