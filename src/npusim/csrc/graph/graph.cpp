// NPU graphs: capture of the device work issued on a stream (and the streams
// that join it), replay of it on stream workers, and the graph's private
// memory pool.
#include "graph.h"

#include "capture.h"
#include "replay.h"

#include "../aten/generator.h"
#include "../runtime/device_allocator.h"

#include <ATen/ATen.h>
#include <ATen/core/GraphImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>

namespace npusim {

// Note [NPU graph capture]
// A stream is a FIFO of host functions run by its worker (runtime/stream.h).
// While a graph captures a stream (the graph sets itself as the stream's
// StreamCapture), NpuStream::enqueue appends the function to the graph
// instead of queueing it: compute ops, copies, foreach copies, batched
// memcpy and the random ops' fills issued on that stream are recorded
// without running, as on CUDA (random ops read the graph-safe Philox state
// when they run: Note [Graph-safe Philox state]); event records and waits
// are nodes that order the lanes of the streams that join the capture (Note
// [Multi-stream capture]). A compute op is launched as it is eagerly (Note
// [Compute on the stream], aten/launch/op_launch.cpp): its arguments walked under
// the fallback's device rules, its outputs sized by its Meta kernel and
// allocated from the graph's pool (in-place and out= outputs are the
// arguments themselves; views of arguments are views of the same device
// storage), and the task that calls its CPU kernel on CPU aliases is the
// task the graph records, so capture is "record instead of push" (a CPU
// generator argument is seeded from the npu generator's graph-safe state
// when the task runs). Replay runs the lanes on stream workers (Note
// [Replaying the lanes]). Ops that must run on the host (Note [Compute on
// the stream]: data-dependent output shapes such as nonzero or
// masked_select, no meta kernel, host values) and out= arguments a capture
// would resize cannot be captured and raise. A host wait or query of a
// captured stream or event raises CUDA's error and, as on the NPU, leaves the
// capture valid; CUDA's potentially unsafe calls invalidate it, which
// capture_end then reports (Note [Capture-time refusals]). Like CUDA,
// the graph works on the tensors it saw at capture: later replays read
// whatever those addresses hold then (CPU scalars as they were at capture,
// as CUDA's kernel arguments). Collectives cannot be captured (the
// collective backend raises).

// Note [NPU graph memory]
// Every device allocation made on the capturing stream comes from the
// graph's private pool (Note [Private pools], runtime/private_pools.cpp):
// capture_begin opens the allocator's allocation scope for the pool on that
// stream (creating the pool, or holding it when its id is shared), a stream
// that joins the capture (Note [Multi-stream capture]) joins that scope,
// capture_end closes the scope, reset() and the destructor let go of the
// pool. As on CUDA, a block freed during capture goes back to the pool and
// later allocations of the pool reuse it (later ops of the capture, later
// captures into a shared pool), so the recorded ops keep no pool block alive:
// the pool holds its memory while a graph holds the pool, outputs and
// temporaries keep their addresses across replays, and replays allocate
// nothing. Graphs passing the same pool id share one pool, which stays alive
// while any of them does (make_graphed_callables relies on that: the
// backward graph reads activations the forward graph wrote). A static output
// keeps its block after its graph is reset, until the tensor dies.

namespace {

CaptureMode capture_mode(const std::string& mode) {
  if (mode == "thread_local") {
    return CaptureMode::kThreadLocal;
  }
  if (mode == "relaxed") {
    return CaptureMode::kRelaxed;
  }
  TORCH_CHECK(mode == "default" || mode == "global",
      "NPUGraph.capture_begin: capture_error_mode must be one of 'default', 'global', "
      "'thread_local', 'relaxed'; got '", mode, "'");
  return CaptureMode::kGlobal;
}

}  // namespace

// ---- the graph --------------------------------------------------------------

c10::MempoolId_t graph_pool_handle() {
  return new_mempool_id(/*user_created=*/true);
}

bool stream_is_capturing(const NpuStream& stream) {
  return stream.capture() != nullptr;
}

NpuGraph::NpuGraph() = default;

NpuGraph::~NpuGraph() {
  reset();  // also ends a capture an exception unwound
}

void NpuGraph::let_go_of_pool() {
  if (holds_pool_) {
    holds_pool_ = false;
    release_pool(device_, pool_id_);
  }
}

void NpuGraph::capture_begin(c10::MempoolId_t pool, const std::string& mode) {
  TORCH_CHECK(!capture_, "NPUGraph.capture_begin: this graph is already capturing on ", capture_->origin().name());
  TORCH_CHECK(!graph_, "NPUGraph.capture_begin: this graph already holds a captured graph; "
      "call reset() or create a new NPUGraph to capture again");
  const CaptureMode error_mode = capture_mode(mode);
  const c10::DeviceIndex device = current_device();
  NpuStream& stream = current_stream(device);
  // As CUDA: capture needs a side stream; replay may then run on any stream.
  TORCH_CHECK(stream.id() != 0, "NPUGraph.capture_begin: npu graphs must be captured on a "
      "non-default stream (current: ", stream.name(), "); use `with torch.npu.graph(g)` or "
      "`with torch.npu.stream(torch.npu.Stream())`. Replay may then run on the default stream.");
  TORCH_CHECK(stream.capture() == nullptr, "NPUGraph.capture_begin: ", stream.name(),
      " is already being captured by another graph");
  device_ = device;
  pool_id_ = pool.first == 0 && pool.second == 0 ? new_mempool_id(/*user_created=*/false) : pool;
  // The graph calls down into the floors below (as CUDA's capture_begin calls
  // beginAllocateToPool): the allocator serves the capture's allocations
  // from the pool, the streams record their tasks (compute ops' launches
  // among them).
  capture_ = std::make_unique<GraphCapture>(this, stream, pool_id_, error_mode);
  holds_pool_ = true;
  for (const auto& client : registered_) {
    capture_->add_client(client);
  }
  register_capture(capture_.get());
}

void NpuGraph::end_capture() {
  unregister_capture(capture_.get());
  capture_->leave_streams();
}

void NpuGraph::forget_clients() {
  for (const auto& [client, increment] : clients_) {
    client->capture_destroyed(capture_id_);
  }
  clients_.clear();
}

void NpuGraph::capture_end() {
  TORCH_CHECK(capture_, "NPUGraph.capture_end: no capture is underway (call capture_begin first)");
  const NpuStream& origin = capture_->origin();
  NpuStream& current = current_stream(device_);
  TORCH_CHECK(&current == &origin, "NPUGraph.capture_end: capture must end on the stream it began on (",
      origin.name(), "), but the current stream is ", current.name());
  end_capture();
  std::unique_ptr<GraphCapture> capture = std::move(capture_);
  capture_id_ = capture->id();
  for (const auto& client : capture->clients()) {
    clients_.emplace_back(client, client->capture_epilogue(capture_id_));
  }
  const std::string invalidated = capture->invalidated();
  const std::string unjoined = invalidated.empty() ? capture->unjoined() : "";
  if (!invalidated.empty() || !unjoined.empty()) {
    forget_clients();
    let_go_of_pool();
    TORCH_CHECK(invalidated.empty(), "NPUGraph.capture_end: the capture on ", origin.name(),
        " was invalidated by a call that is not permitted during capture: ", invalidated);
    TORCH_CHECK(false, "NPUGraph.capture_end: ", unjoined);
  }
  const size_t num_records = capture->num_records();
  std::vector<std::pair<size_t, size_t>> order = capture->take_issue_order();
  graph_ = make_captured_graph(device_, capture->take_lanes(), num_records, std::move(order));
  if (graph_->num_tasks() == 0) {
    TORCH_WARN("The npu graph is empty: nothing was issued on ", origin.name(),
        " during capture (work on another device, or on a stream that did not wait on the capturing "
        "stream, is not captured).");
  }
}

void NpuGraph::replay() {
  TORCH_CHECK(graph_, "NPUGraph.replay: the graph has not been captured (call capture_begin and "
      "capture_end, or use `with torch.npu.graph(g)`, first)");
  NpuStream& stream = current_stream(device_);
  TORCH_CHECK(stream.capture() == nullptr || (graph_->lanes.size() == 1 && clients_.empty()),
      "NPUGraph.replay: cannot replay a graph of several streams or with random ops into ", stream.name(),
      ", which is being captured");
  std::vector<std::function<void()>> prologue;
  for (const auto& [client, increment] : clients_) {
    if (auto fn = client->replay_prologue(capture_id_, increment)) {
      prologue.push_back(std::move(fn));
    }
  }
  enqueue_replay(graph_, stream, std::move(prologue));
}

void NpuGraph::reset() {
  if (capture_) {
    end_capture();
    capture_id_ = capture_->id();
    for (const auto& client : capture_->clients()) {
      clients_.emplace_back(client, 0);
    }
    capture_.reset();
  }
  forget_clients();
  graph_.reset();
  let_go_of_pool();
}

c10::MempoolId_t NpuGraph::pool() const {
  TORCH_CHECK(holds_pool_, "NPUGraph.pool: called without a preceding capture");
  return pool_id_;
}

size_t NpuGraph::num_tasks() const {
  return graph_ ? graph_->num_tasks() : 0;
}

std::vector<size_t> NpuGraph::replay_levels() const {
  return graph_ ? graph_->dag.level_sizes : std::vector<size_t>();
}

void NpuGraph::register_generator_state(const at::Generator& generator) {
  std::shared_ptr<CaptureClient> state = npu_generator(generator, "NPUGraph.register_generator_state")->state();
  if (std::find(registered_.begin(), registered_.end(), state) == registered_.end()) {
    registered_.push_back(state);
  }
  if (capture_) {
    capture_->add_client(state);
  }
}

NpuGraph* NpuGraph::get_currently_capturing_graph() {
  StreamCapture* capture = current_stream(current_device()).capture();
  TORCH_CHECK(capture != nullptr, "The current stream is not currently capturing.");
  auto* graph_capture = dynamic_cast<GraphCapture*>(capture);
  TORCH_CHECK(graph_capture != nullptr && graph_capture->graph() != nullptr,
      "get_currently_capturing_graph() can be used only between capture_begin() and capture_end().");
  return graph_capture->graph();
}

void NpuGraph::debug_dump(const std::string& path) const {
  if (!debug_) {
    TORCH_WARN("NPU Graphs debug not enabled, set with [graph].enable_debug_mode()");
    return;
  }
  TORCH_CHECK(graph_, "NPUGraph.debug_dump: the graph has not been captured");
  std::ofstream out(path);
  TORCH_CHECK(out, "NPUGraph.debug_dump: cannot write ", path);
  out << "npu graph on npu:" << static_cast<int>(device_) << ", pool (" << pool_id_.first << ", "
      << pool_id_.second << "), " << graph_->lanes.size() << " lanes, " << graph_->num_tasks() << " tasks\n";
  for (size_t l = 0; l < graph_->lanes.size(); ++l) {
    const GraphLane& lane = graph_->lanes[l];
    for (size_t i = 0; i < lane.tasks.size(); ++i) {
      const GraphTask& t = lane.tasks[i];
      out << "lane " << l << " (" << lane.stream->name() << ")\t" << i << "\t" << t.label;
      if (t.kind != GraphTask::Kind::kRun) {
        out << " " << t.record;
      }
      out << "\t" << t.duration_us << " us\n";
    }
  }
}

// ---- torch.accelerator.Graph ------------------------------------------------

namespace {

// torch.accelerator.Graph looks its implementation up by the device type's
// name (c10::DeviceTypeName(PrivateUse1) is the upper-cased backend name).
class AcceleratorGraph final : public at::GraphImplInterface {
 public:
  explicit AcceleratorGraph(const at::GraphImplArgs&) {}
  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) override {
    graph_.capture_begin(pool, mode_name(mode));
  }
  void capture_end() override { graph_.capture_end(); }
  void instantiate() override {
    TORCH_CHECK(graph_.captured(), "Graph.instantiate: the graph has not been captured");
  }
  void replay() override { graph_.replay(); }
  void reset() override { graph_.reset(); }
  c10::MempoolId_t pool() const override { return graph_.pool(); }
  void enable_debug_mode() override { graph_.enable_debug_mode(); }
  void debug_dump(const std::string& path) override { graph_.debug_dump(path); }

 private:
  static const char* mode_name(at::GraphCaptureMode mode) {
    switch (mode) {
      case at::GraphCaptureMode::ThreadLocal:
        return "thread_local";
      case at::GraphCaptureMode::Relaxed:
        return "relaxed";
      case at::GraphCaptureMode::Default:
        return "default";
      default:
        return "global";
    }
  }
  NpuGraph graph_;
};

}  // namespace
}  // namespace npusim

namespace at {
REGISTER_GRAPH_IMPL(NPU, npusim::AcceleratorGraph);
}  // namespace at
