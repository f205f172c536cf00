// Which tasks of a captured lane may run at once (replay_levels.cpp), from
// what each reads and writes. See Note [Replaying independent tasks at once].
#pragma once

#include "capture.h"

#include <cstdint>
#include <vector>

namespace npusim {

// The lane's tasks (indices into `tasks`, kRun only) in levels: a task comes
// in a later level than every earlier task it conflicts with (it reads what
// that one writes, or writes what that one reads or writes), and a task of
// unknown access in a level of its own, after every earlier task and before
// every later one; within a level, in capture order. Empty when no level
// holds two tasks: the replay then runs the lane in its order.
std::vector<std::vector<uint32_t>> independent_levels(const std::vector<GraphTask>& tasks);

}  // namespace npusim
