// What an npu graph capture holds (capture.cpp): a lane of
// recorded tasks per stream of the capture, the event records and waits that
// order the lanes, the id of the private pool its allocations come from
// (runtime/private_pools.cpp), the clients
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
  // kRun: what it reads and writes, when its launch said (Note [Replaying
  // independent tasks at once]); unknown, it orders every task around it.
  bool access_known = false;
  TaskAccess access;
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

// A capture underway; its streams hand it their tasks.
class GraphCapture final : public StreamCapture {
 public:
  GraphCapture(NpuGraph* graph, NpuStream& origin, c10::MempoolId_t pool, CaptureMode mode);

  uint64_t id() const override { return id_; }
  CaptureMode mode() const override { return mode_; }
  std::thread::id thread() const override { return thread_; }
  const NpuStream& origin() const override { return origin_; }
  void add_task(NpuStream& stream, std::function<void()> fn, double duration_us, const char* op,
      const TaskAccess* access) override;
  uint64_t record_event(NpuStream& stream) override;
  void wait_event(NpuStream& stream, uint64_t node) override;
  void add_client(std::shared_ptr<CaptureClient> client) override;
  [[noreturn]] void refuse(const std::string& message) override;

  // Appends `task` to the lane of `stream`, a stream of the capture.
  void append(const NpuStream& stream, GraphTask task);
  NpuGraph* graph() const { return graph_; }
  // The private pool the capture's streams allocate from (Note [NPU graph memory]).
  c10::MempoolId_t pool() const { return pool_; }
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
  const c10::MempoolId_t pool_;
  std::mutex mutex_;
  std::vector<GraphLane> lanes_;  // lanes_[0]: the origin
  std::vector<NpuStream*> streams_;  // the stream of each lane, until they leave
  std::vector<std::pair<size_t, size_t>> issue_order_;
  std::vector<RecordPoint> records_;
  std::vector<std::shared_ptr<CaptureClient>> clients_;
  std::string invalidated_;
};

}  // namespace npusim
