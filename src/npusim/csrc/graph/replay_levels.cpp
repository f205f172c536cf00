// Levels of a captured lane's tasks: which may run at once at replay.
#include "replay_levels.h"

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
// device copy: its source and destination) hands that to the capture as
// byte ranges of whole storages (TaskAccess), and at capture end a
// single-lane graph's tasks are put in levels: a task's level is one past
// that of every earlier task it conflicts with (read after write, write
// after read or write, on overlapping bytes, so that memory of the graph's
// pool reused by a later allocation orders its users too), found by one pass
// over an interval map of the last writer's level and the latest reader's
// level per byte range. A task of unknown access (a random fill, a
// collective, a replay of another graph, a host function) is a level of its
// own between all tasks before and after it. The replay runs a level of
// several tasks through NpuStream::run_shared, a task per item: the worker
// and a host thread that waits for the replay's stream (Note [A waiting host
// helps]) claim tasks, under the worker's thread-local state (grad mode,
// dispatch keys, Python modes) and with subnormals kept. Levels run in
// order; a task's results, its chip time (the replay's task still lasts the
// sum of its tasks' durations: the chip runs a stream's kernels one at a
// time) and the graph's numbers are those of the ordered replay. Levels, not
// a dependency-counted queue: a level waits for its slowest task, but the
// bookkeeping per replay is one counter per level, and a backward's
// independent kernels (a Linear's input and weight gradients, its bias's
// sum) sit in one level. Multi-lane graphs keep their lanes' order (their
// lanes already run at once), as does realtime timing, whose sleeps model
// the chip's one-at-a-time stream.

namespace {

// What a byte range was last used for, in levels (-1: never).
struct ByteSpan {
  uintptr_t end;
  int64_t write_level = -1;  // the last task that wrote it
  int64_t read_level = -1;   // the latest level that read it since then
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
      spans_.emplace_hint(std::next(it), at, right);
    }
  }

  std::map<uintptr_t, ByteSpan> spans_;  // by first byte
};

}  // namespace

std::vector<std::vector<uint32_t>> independent_levels(const std::vector<GraphTask>& tasks) {
  std::vector<std::vector<uint32_t>> levels;
  ByteSpanMap spans;
  int64_t floor = 0;  // the level after the last task of unknown access
  for (size_t i = 0; i < tasks.size(); ++i) {
    const GraphTask& task = tasks[i];
    if (task.kind != GraphTask::Kind::kRun) {
      continue;  // a single lane's record and wait nodes order nothing
    }
    int64_t level = floor;
    if (!task.access_known) {
      level = static_cast<int64_t>(levels.size());
      floor = level + 1;
    } else {
      for (const TaskAccess::Range& r : task.access.ranges) {
        spans.each(r.begin, r.end, [&](const ByteSpan& s) {
          level = std::max(level, std::max(s.write_level, r.write ? s.read_level : int64_t{-1}) + 1);
        });
      }
      for (const TaskAccess::Range& r : task.access.ranges) {
        spans.each(r.begin, r.end, [&](ByteSpan& s) {
          if (r.write) {
            s.write_level = level;
            s.read_level = -1;
          } else if (s.write_level != level) {  // its own write covers its read
            s.read_level = std::max(s.read_level, level);
          }
        });
      }
    }
    if (static_cast<size_t>(level) >= levels.size()) {
      levels.resize(static_cast<size_t>(level) + 1);
    }
    levels[static_cast<size_t>(level)].push_back(static_cast<uint32_t>(i));
  }
  const bool any_together = std::any_of(levels.begin(), levels.end(), [](const auto& l) { return l.size() > 1; });
  return any_together ? levels : std::vector<std::vector<uint32_t>>();
}

}  // namespace npusim
