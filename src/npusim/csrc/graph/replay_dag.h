// Which tasks of a captured lane may run at once (replay_dag.cpp): the lane
// as a DAG of what its tasks read and write. See Note [Replaying independent
// tasks at once].
#pragma once

#include "capture.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace npusim {

// A lane's kRun tasks, each after every earlier task it conflicts with (it
// reads what that one writes, or writes what that one reads or writes), a
// task of unknown access after every earlier task and before every later
// one. Tasks are named by their position in `tasks`.
struct ReplayDag {
  std::vector<uint32_t> tasks;                    // indices into the lane's tasks, in capture order
  std::vector<std::vector<uint32_t>> successors;  // the tasks that wait for each
  std::vector<int32_t> predecessors;              // how many tasks each waits for
  std::vector<int32_t> height;                    // the most tasks on a path from it to the end
  std::vector<uint8_t> worker_only;               // of unknown access: the stream worker runs it
  std::vector<size_t> level_sizes;                // tasks at each depth (the longest path to them)
  double duration_us = 0.0;                       // the tasks' modelled durations, summed

  bool empty() const { return tasks.empty(); }
};

// The DAG of `tasks`, or an empty one when no two of them may run at once
// (the replay then runs the lane in its order).
ReplayDag independent_tasks(const std::vector<GraphTask>& tasks);

}  // namespace npusim
