// NPU graphs (graph.cpp): capture of the device work issued on a stream (and
// the streams that join it) and its replay, with a private memory pool. See
// Note [NPU graph capture].
#pragma once

#include "../runtime/stream.h"

#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace npusim {

class GraphCapture;   // a capture underway (capture.h)
struct CapturedGraph; // the lanes of a captured graph (replay.h)

// ---- the graph --------------------------------------------------------------

// graph_pool_handle(): an id that graphs can share a pool through.
c10::MempoolId_t graph_pool_handle();
bool stream_is_capturing(const NpuStream& stream);

class NpuGraph {
 public:
  NpuGraph();
  NpuGraph(const NpuGraph&) = delete;
  NpuGraph& operator=(const NpuGraph&) = delete;
  ~NpuGraph();

  // Captures the current stream of the current device; pool {0, 0}: a new
  // private pool. mode: "default" (= "global"), "global", "thread_local" or "relaxed".
  void capture_begin(c10::MempoolId_t pool = {0, 0}, const std::string& mode = "global");
  void capture_end();
  // Enqueues the captured work on the current stream of the graph's device
  // (Note [Replaying the lanes]); returns at once.
  void replay();
  void reset();
  c10::MempoolId_t pool() const;
  size_t num_tasks() const;
  // How many tasks of the graph sit at each depth of its DAG (those of one
  // depth are independent), or empty when a replay runs the graph in capture
  // order (Note [Replaying independent tasks at once]).
  std::vector<size_t> replay_levels() const;
  bool captured() const { return graph_ != nullptr; }
  void enable_debug_mode() { debug_ = true; }
  // Writes the captured lanes; without enable_debug_mode() warns, as CUDA does.
  void debug_dump(const std::string& path) const;
  // Makes the graph prepare `generator`'s Philox state before each replay (it
  // registers itself on first use in a capture anyway; Note [Graph-safe Philox state]).
  void register_generator_state(const at::Generator& generator);
  // The graph capturing the current stream (CUDA's errors otherwise).
  static NpuGraph* get_currently_capturing_graph();

 private:
  void end_capture();
  void forget_clients();
  // Releases the graph's hold on its pool (Note [NPU graph memory]).
  void let_go_of_pool();

  std::unique_ptr<GraphCapture> capture_;
  std::shared_ptr<const CapturedGraph> graph_;
  c10::MempoolId_t pool_id_{0, 0};
  bool holds_pool_ = false;  // the allocator counts this graph as a user of pool_id_
  // Generator states registered for the next capture, and those the
  // captured graph prepares with their whole-graph increments.
  std::vector<std::shared_ptr<CaptureClient>> registered_;
  std::vector<std::pair<std::shared_ptr<CaptureClient>, uint64_t>> clients_;
  uint64_t capture_id_ = 0;
  c10::DeviceIndex device_ = -1;
  bool debug_ = false;
};

}  // namespace npusim
