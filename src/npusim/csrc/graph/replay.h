// Replay of a captured npu graph (replay.cpp): its lanes as a DAG on stream
// workers. See Note [Replaying the lanes].
#pragma once

#include "capture.h"
#include "replay_dag.h"

#include <functional>
#include <memory>
#include <vector>

namespace npusim {

// A captured graph: its lanes and records, immutable once captured, shared by
// every replay in flight.
struct CapturedGraph {
  c10::DeviceIndex device = -1;
  std::vector<GraphLane> lanes;  // lanes[0]: the origin's
  size_t num_records = 0;
  // Every task as (lane, index) in the order they were issued during capture.
  std::vector<std::pair<size_t, size_t>> issue_order;
  // A single lane's tasks as a DAG, or empty where they replay in order
  // (Note [Replaying independent tasks at once]).
  ReplayDag dag;

  size_t num_tasks() const;
};

// Orders the captured lanes into a graph (issue_order: capture order, which
// every wait respects, since a wait follows the record it waits for).
std::shared_ptr<const CapturedGraph> make_captured_graph(c10::DeviceIndex device, std::vector<GraphLane> lanes,
    size_t num_records, std::vector<std::pair<size_t, size_t>> issue_order);

// Enqueues one replay of `graph` on `stream` and returns: the origin's lane
// runs as one task of `stream` after `prologue`, each other lane as one task
// of a replay lane stream of the device.
void enqueue_replay(const std::shared_ptr<const CapturedGraph>& graph, NpuStream& stream,
    std::vector<std::function<void()>> prologue);

}  // namespace npusim
