// NPU graphs (graph.cpp): capture of the device work issued on a stream and
// its replay, with a private memory pool. See Note [NPU graph capture].
#pragma once

#include "../runtime/stream.h"

#include <c10/core/Allocator.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace npusim {

struct GraphCapture;  // a capture underway on one stream (capture.h)
struct GraphPool;     // a graph's private memory pool (capture.h)
struct GraphTask;

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
  // private pool. mode: "default", "global", "thread_local" or "relaxed".
  void capture_begin(c10::MempoolId_t pool = {0, 0}, const std::string& mode = "global");
  void capture_end();
  // Enqueues the captured work as one task on the current stream of the
  // graph's device; returns at once.
  void replay();
  void reset();
  c10::MempoolId_t pool() const;
  size_t num_tasks() const;
  bool captured() const { return tasks_ != nullptr; }
  void enable_debug_mode() { debug_ = true; }
  void debug_dump(const std::string& path) const;

 private:
  void end_capture();

  std::unique_ptr<GraphCapture> capture_;
  std::shared_ptr<const std::vector<GraphTask>> tasks_;
  std::shared_ptr<GraphPool> pool_;
  NpuStream* stream_ = nullptr;
  c10::DeviceIndex device_ = -1;
  bool debug_ = false;
};

}  // namespace npusim
