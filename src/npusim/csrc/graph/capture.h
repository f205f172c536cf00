// What an npu graph capture holds (capture.cpp): a lane of
// recorded tasks per stream of the capture, the event records and waits that
// order the lanes, the private pool its allocations come from, the clients
// its replays prepare, and the first forbidden call. See Note [NPU graph
// capture] and Note [Multi-stream capture].
#pragma once

#include "../runtime/device_allocator.h"
#include "../runtime/stream.h"

#include <c10/core/Allocator.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace npusim {

class NpuGraph;

// One node of a lane: work to run, or an event record / wait between lanes.
struct GraphTask {
  enum class Kind : uint8_t { kRun, kRecord, kWait };
  std::function<void()> fn;  // kRun
  double duration_us = 0.0;
  std::string label;  // for debug_dump
  Kind kind = Kind::kRun;
  size_t record = 0;  // kRecord: the record it completes; kWait: the record it waits for
};

// The tasks one stream issued during the capture, in its order.
struct GraphLane {
  const NpuStream* stream = nullptr;  // where it was captured (debug_dump)
  std::vector<GraphTask> tasks;
};

// Where a record node sits: the first `position` tasks of `lane` precede it.
struct RecordPoint {
  size_t lane;
  size_t position;
};

// A graph's private memory pool (Note [NPU graph memory]): blocks of the
// ordinary device allocator kept alive until the pool goes away.
struct GraphPool final : PrivatePool {
  c10::MempoolId_t id;
  std::mutex mutex;
  std::vector<std::shared_ptr<c10::DataPtr>> blocks;

  c10::DataPtr allocate(c10::DeviceIndex device, size_t nbytes) override;
};

// A capture underway; its streams hand it their tasks.
class GraphCapture final : public StreamCapture {
 public:
  GraphCapture(NpuGraph* graph, NpuStream& origin, std::shared_ptr<GraphPool> pool, CaptureMode mode);

  uint64_t id() const override { return id_; }
  CaptureMode mode() const override { return mode_; }
  std::thread::id thread() const override { return thread_; }
  const NpuStream& origin() const override { return origin_; }
  void add_task(NpuStream& stream, std::function<void()> fn, double duration_us, const char* op) override;
  uint64_t record_event(NpuStream& stream) override;
  void wait_event(NpuStream& stream, uint64_t node) override;
  void add_client(std::shared_ptr<CaptureClient> client) override;
  [[noreturn]] void refuse(const std::string& message) override;

  // Appends `task` to the lane of `stream`, a stream of the capture.
  void append(const NpuStream& stream, GraphTask task);
  NpuGraph* graph() const { return graph_; }
  const std::shared_ptr<GraphPool>& pool() const { return pool_; }
  // Takes every stream out of the capture (and its pool); idempotent.
  void leave_streams();
  // The first forbidden call, or "".
  std::string invalidated();
  // Why the capture cannot end (CUDA's "capturing stream has unjoined work"), or "".
  std::string unjoined();
  // The lanes, records and clients, moved out once the capture has ended.
  std::vector<GraphLane> take_lanes();
  // Every task as (lane, index), in the order the streams issued them.
  std::vector<std::pair<size_t, size_t>> take_issue_order();
  size_t num_records();
  std::vector<std::shared_ptr<CaptureClient>> clients();

 private:
  size_t lane_of_locked(const NpuStream& stream) const;  // SIZE_MAX: not in the capture
  void push_locked(size_t lane, GraphTask task);

  const uint64_t id_;
  const CaptureMode mode_;
  const std::thread::id thread_;
  NpuGraph* const graph_;
  NpuStream& origin_;
  const std::shared_ptr<GraphPool> pool_;
  std::mutex mutex_;
  std::vector<GraphLane> lanes_;  // lanes_[0]: the origin
  std::vector<NpuStream*> streams_;  // the stream of each lane, until they leave
  std::vector<std::pair<size_t, size_t>> issue_order_;
  std::vector<RecordPoint> records_;
  std::vector<std::shared_ptr<CaptureClient>> clients_;
  std::string invalidated_;
};

}  // namespace npusim
