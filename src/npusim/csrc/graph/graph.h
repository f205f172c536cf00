// NPU graphs (graph.cpp): capture of the device work issued on a stream and
// its replay, with a private memory pool. See Note [NPU graph capture].
#pragma once

#include "runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace npusim {

struct GraphCapture;  // a capture underway on one stream
struct GraphPool;     // a graph's private memory pool
struct GraphTask {
  std::function<void()> fn;
  double duration_us;
  std::string label;  // for debug_dump
};

// ---- hooks (each one load of an atomic while no capture is underway) ------

// NpuStream::enqueue on a capturing stream: append the task to the capture.
void capture_task(GraphCapture& capture, std::function<void()> fn, double duration_us);
// A host wait on a capturing stream: invalidates the capture and raises
// CUDA's "operation not permitted when stream is capturing".
[[noreturn]] void raise_capturing(GraphCapture& capture, const NpuStream& stream, const char* op);
// The device allocator while the current stream of `device` is capturing: a
// block of the graph's pool; an empty DataPtr when no capture applies.
c10::DataPtr allocate_for_capture(c10::DeviceIndex device, size_t nbytes);
// The boxed fallback: records `op` into the capture of the current stream
// (outputs from the op's meta shapes, in the pool) and leaves the outputs on
// the stack. False (stack untouched) when that stream is not capturing.
bool capture_fallback_op(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Whether any stream is being captured (the unboxed fallback kernels then
// take the boxed route, which capture_fallback_op can record).
bool graph_capture_underway();

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
