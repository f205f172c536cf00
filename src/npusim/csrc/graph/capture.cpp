// An npu graph capture underway: the lanes its streams record into, the
// events that join them, and the check that every lane joined back.
#include "capture.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>

namespace npusim {

// Note [Multi-stream capture]
// As CUDA's stream capture: an event recorded on a stream of a capture is not
// a task but a record node of the graph (its EventRecord names the capture and
// the node, runtime/event.h), and a stream that waits on such an event joins
// the capture: from then on its tasks are recorded into its own lane of the
// graph (its allocations come from the graph's pool), after a wait node on
// that record. Waits between lanes (stream.wait_stream, Event.wait) become
// wait nodes; a wait on an event recorded outside the capture that has not
// completed is CUDA's "dependency created on uncaptured work in another
// stream", and a stream of one capture waiting on another's event is "a merge
// of separate capture sequences". The capture ends on its origin stream only
// when every lane's work precedes the origin's last task through these
// records and waits (each forked stream joined back); otherwise capture_end
// raises CUDA's "capturing stream has unjoined work" and no graph is made.
// Every stream leaves the capture at its end. Replay (replay.cpp) runs the
// lanes as a DAG: see Note [Replaying the lanes].

namespace {

std::atomic<uint64_t> g_next_capture_id{1};

}  // namespace

GraphCapture::GraphCapture(NpuGraph* graph, NpuStream& origin, c10::MempoolId_t pool, CaptureMode mode)
    : id_(g_next_capture_id.fetch_add(1)),
      mode_(mode),
      thread_(std::this_thread::get_id()),
      graph_(graph),
      origin_(origin),
      pool_(pool) {
  lanes_.push_back(GraphLane{&origin, {}});
  streams_.push_back(&origin);
  begin_allocate_to_pool(origin, pool_);  // creates the pool or holds it; the graph lets go (release_pool)
  origin.set_capture(this);
}

size_t GraphCapture::lane_of_locked(const NpuStream& stream) const {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i] == &stream) {
      return i;
    }
  }
  return SIZE_MAX;
}

void GraphCapture::push_locked(size_t lane, GraphTask task) {
  issue_order_.emplace_back(lane, lanes_[lane].tasks.size());
  lanes_[lane].tasks.push_back(std::move(task));
}

void GraphCapture::append(const NpuStream& stream, GraphTask task) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t lane = lane_of_locked(stream);
  TORCH_INTERNAL_ASSERT(lane != SIZE_MAX, "npu graph capture: ", stream.name(), " is not in the capture");
  push_locked(lane, std::move(task));
}

void GraphCapture::add_task(NpuStream& stream, std::function<void()> fn, double duration_us, const char* op,
    const TaskAccess* access) {
  GraphTask task{std::move(fn), duration_us, op != nullptr ? op : "stream task"};
  if (access != nullptr) {
    task.access_known = true;
    task.access = *access;
  }
  append(stream, std::move(task));
}

uint64_t GraphCapture::record_event(NpuStream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t lane = lane_of_locked(stream);
  TORCH_INTERNAL_ASSERT(lane != SIZE_MAX, "npu graph capture: ", stream.name(), " is not in the capture");
  const size_t record = records_.size();
  records_.push_back(RecordPoint{lane, lanes_[lane].tasks.size()});
  GraphTask node;
  node.kind = GraphTask::Kind::kRecord;
  node.label = "event_record";
  node.record = record;
  push_locked(lane, std::move(node));
  return record + 1;  // node ids start at 1: 0 means "not captured"
}

void GraphCapture::wait_event(NpuStream& stream, uint64_t node) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_INTERNAL_ASSERT(node >= 1 && node <= records_.size(), "npu graph capture: unknown record node ", node);
  size_t lane = lane_of_locked(stream);
  if (lane == SIZE_MAX) {
    // The stream joins the capture (Note [Multi-stream capture]).
    TORCH_CHECK(stream.device() == origin_.device(), "npu graph capture: ", stream.name(),
        " waits on an event of the capture of ", origin_.name(), "; a capture spans the streams of one device");
    lane = lanes_.size();
    lanes_.push_back(GraphLane{&stream, {}});
    streams_.push_back(&stream);
    join_allocate_to_pool(stream, pool_);
    stream.set_capture(this);
  }
  GraphTask wait;
  wait.kind = GraphTask::Kind::kWait;
  wait.label = "wait_event";
  wait.record = node - 1;
  push_locked(lane, std::move(wait));
}

void GraphCapture::add_client(std::shared_ptr<CaptureClient> client) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::find(clients_.begin(), clients_.end(), client) == clients_.end()) {
    clients_.push_back(std::move(client));
  }
}

void GraphCapture::refuse(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (invalidated_.empty()) {
      invalidated_ = message;
    }
  }
  TORCH_CHECK(false, message);
}

void GraphCapture::leave_streams() {
  std::vector<NpuStream*> streams;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams.swap(streams_);
  }
  for (NpuStream* s : streams) {
    s->set_capture(nullptr);
    end_allocate_to_pool(*s, pool_);
  }
}

std::string GraphCapture::invalidated() {
  std::lock_guard<std::mutex> lock(mutex_);
  return invalidated_;
}

std::string GraphCapture::unjoined() {
  std::lock_guard<std::mutex> lock(mutex_);
  // reach[l]: how many of lane l's first tasks precede the origin's end,
  // through the records other lanes' waits depend on (a fixpoint over waits).
  std::vector<size_t> reach(lanes_.size(), 0);
  reach[0] = lanes_[0].tasks.size();
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t l = 0; l < lanes_.size(); ++l) {
      for (size_t i = 0; i < reach[l]; ++i) {
        const GraphTask& t = lanes_[l].tasks[i];
        if (t.kind != GraphTask::Kind::kWait) {
          continue;
        }
        const RecordPoint& r = records_[t.record];
        if (reach[r.lane] < r.position) {
          reach[r.lane] = r.position;
          grew = true;
        }
      }
    }
  }
  for (size_t l = 1; l < lanes_.size(); ++l) {
    const auto& tasks = lanes_[l].tasks;
    for (size_t i = reach[l]; i < tasks.size(); ++i) {
      if (tasks[i].kind == GraphTask::Kind::kRun) {
        return c10::str("capturing stream has unjoined work: ", lanes_[l].stream->name(),
            " joined the capture of ", origin_.name(), " and its ", tasks[i].label,
            " (task ", i, " of its lane) is not waited for by ", origin_.name(), "; make ", origin_.name(),
            " wait for it (wait_stream, or wait on an event recorded after that work) before capture_end");
      }
    }
  }
  return "";
}

std::vector<GraphLane> GraphCapture::take_lanes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::move(lanes_);
}

std::vector<std::pair<size_t, size_t>> GraphCapture::take_issue_order() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::move(issue_order_);
}

size_t GraphCapture::num_records() {
  std::lock_guard<std::mutex> lock(mutex_);
  return records_.size();
}

std::vector<std::shared_ptr<CaptureClient>> GraphCapture::clients() {
  std::lock_guard<std::mutex> lock(mutex_);
  return clients_;
}

}  // namespace npusim
