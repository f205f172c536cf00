// A captured lane's tasks as a DAG: which may run at once at replay.
#include "replay_dag.h"

#include <algorithm>
#include <map>

namespace npusim {

// Note [Replaying independent tasks at once]
// A replay runs its graph as one task of one stream worker (Note [Replaying
// the lanes]), so a captured training step ran its kernels one after
// another, where eager ran the forward's small ops on the host and the
// backward's on autograd's device thread while the worker ran earlier ones:
// on this 2-core VM the replayed step was no faster than eager (1.01 of it
// end to end, `bench graph-replay`). A graph's kernels need not run in
// capture order, only in an order that respects what they share, as CUDA's
// graph launch runs independent nodes of a graph at once. So a launch that
// knows what its task reads and writes (a compute op: its npu arguments,
// read or written as the schema says, and its fresh outputs, written; a
// device copy: its source and destination; a compiled C++ kernel: its
// arguments as inductor declares them) hands that to the capture as byte
// ranges of whole storages (TaskAccess), and at capture end a single-lane
// graph becomes a DAG: a task waits for every earlier task it conflicts with
// (read after write, write after read or write, on overlapping bytes, so
// that memory of the graph's pool reused by a later allocation orders its
// users too), found in one pass over an interval map of each byte range's
// last writer and its readers since. A task of unknown access (a random
// fill, a replay of another graph, a host function) waits for every task
// before it, every task after it waits for it, and only the stream worker
// runs it. A replay runs the DAG through NpuStream::run_shared_as_worker:
// the worker, and a host thread that waits for the replay's stream (Note [A
// waiting host helps]), each take a task whose predecessors have run, under the worker's
// thread-local state (grad mode, dispatch keys, Python modes) and with
// subnormals kept; a host leaves with the intra-op thread count it came
// with, whatever team its tasks' kernels set. A thread that finishes a task goes on with the successor
// it made ready that has the longest path to the end (its inputs are in this
// core's cache, and it is on the critical path) and leaves the others to be
// taken. Results and numbers are the ordered replay's (each task computes
// what it did); so is the replay's chip time, which still lasts the sum of
// its tasks' durations (the chip runs a stream's kernels one at a time).
// Multi-lane graphs keep their lanes' order (their lanes already run at
// once), as does realtime timing, whose sleeps model the chip's one stream.
// Graphs whose DAG has no two tasks at the same depth (a chain) replay in
// order, as before. NPUGraph.replay_levels() reports the tasks per depth.

namespace {

// Who last used a byte range: the last task that wrote it and the tasks that
// read it since (positions in the DAG).
struct ByteSpan {
  uintptr_t end;
  int32_t writer = -1;
  std::vector<int32_t> readers;
};

// Disjoint spans covering every byte a task touched so far.
class ByteSpanMap {
 public:
  // Calls fn(span) for the spans covering [begin, end), split at both ends,
  // with fresh spans where nothing touched the bytes before.
  template <class Fn>
  void each(uintptr_t begin, uintptr_t end, Fn&& fn) {
    split(begin);
    split(end);
    auto it = spans_.lower_bound(begin);
    uintptr_t at = begin;
    while (at < end) {
      if (it == spans_.end() || it->first > at) {
        const uintptr_t gap_end = it == spans_.end() ? end : std::min(end, it->first);
        it = spans_.emplace_hint(it, at, ByteSpan{gap_end});
      }
      fn(it->second);
      at = it->second.end;
      ++it;
    }
  }
  void clear() { spans_.clear(); }

 private:
  // A span over `at` becomes two, meeting at `at`.
  void split(uintptr_t at) {
    auto it = spans_.upper_bound(at);
    if (it == spans_.begin()) {
      return;
    }
    --it;
    if (it->first < at && at < it->second.end) {
      ByteSpan right = it->second;
      it->second.end = at;
      spans_.emplace_hint(std::next(it), at, std::move(right));
    }
  }

  std::map<uintptr_t, ByteSpan> spans_;  // by first byte
};

}  // namespace

ReplayDag independent_tasks(const std::vector<GraphTask>& tasks) {
  ReplayDag dag;
  ByteSpanMap spans;
  std::vector<int32_t> depth;
  int32_t barrier = -1;  // the last task of unknown access
  std::vector<int32_t> deps;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const GraphTask& task = tasks[i];
    if (task.kind != GraphTask::Kind::kRun) {
      continue;  // a single lane's record and wait nodes order nothing
    }
    const auto p = static_cast<int32_t>(dag.tasks.size());
    deps.clear();
    if (barrier >= 0) {
      deps.push_back(barrier);
    }
    if (!task.access_known) {
      for (int32_t q = barrier + 1; q < p; ++q) {
        deps.push_back(q);
      }
      barrier = p;
      spans.clear();  // every later task waits for this one, which waits for all before
    } else {
      for (const TaskAccess::Range& r : task.access.ranges) {
        spans.each(r.begin, r.end, [&](const ByteSpan& s) {
          if (s.writer >= 0) {
            deps.push_back(s.writer);
          }
          if (r.write) {
            deps.insert(deps.end(), s.readers.begin(), s.readers.end());
          }
        });
      }
      for (const TaskAccess::Range& r : task.access.ranges) {
        spans.each(r.begin, r.end, [&](ByteSpan& s) {
          if (r.write) {
            s.writer = p;
            s.readers.clear();
          } else if (s.writer != p && (s.readers.empty() || s.readers.back() != p)) {
            s.readers.push_back(p);  // (its own write covers its read)
          }
        });
      }
    }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    int32_t d = 0;
    for (const int32_t q : deps) {  // all earlier than p
      dag.successors[static_cast<size_t>(q)].push_back(static_cast<uint32_t>(p));
      d = std::max(d, depth[static_cast<size_t>(q)] + 1);
    }
    dag.tasks.push_back(static_cast<uint32_t>(i));
    dag.successors.emplace_back();
    dag.predecessors.push_back(static_cast<int32_t>(deps.size()));
    dag.worker_only.push_back(task.access_known ? 0 : 1);
    dag.duration_us += task.duration_us;
    depth.push_back(d);
    if (static_cast<size_t>(d) >= dag.level_sizes.size()) {
      dag.level_sizes.resize(static_cast<size_t>(d) + 1, 0);
    }
    ++dag.level_sizes[static_cast<size_t>(d)];
  }
  if (std::none_of(dag.level_sizes.begin(), dag.level_sizes.end(), [](size_t n) { return n > 1; })) {
    return ReplayDag();
  }
  dag.height.assign(dag.tasks.size(), 1);
  for (size_t p = dag.tasks.size(); p-- > 0;) {
    for (const uint32_t s : dag.successors[p]) {
      dag.height[p] = std::max(dag.height[p], dag.height[s] + 1);
    }
  }
  return dag;
}

}  // namespace npusim
