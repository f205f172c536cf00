// NPU graphs: capture of the device work issued on a stream, replay of it as
// one stream task, and the graph's private memory pool.
#include "graph.h"

#include "capture.h"

#include "../runtime/device_allocator.h"

#include <ATen/ATen.h>
#include <ATen/core/GraphImplInterface.h>
#include <c10/util/Exception.h>

#include <fstream>
#include <map>
#include <mutex>
#include <unordered_map>

namespace npusim {

// Note [NPU graph capture]
// A stream is a FIFO of host functions run by its worker (runtime/stream.h).
// While a graph captures a stream (the graph sets itself as the stream's
// StreamCapture), NpuStream::enqueue appends the function to the graph
// instead of queueing it: compute ops, copies, foreach copies, batched
// memcpy and event records issued on that stream are recorded without
// running, as on CUDA. A compute op is launched as it is eagerly (Note
// [Compute on the stream], aten/op_launch.cpp): its arguments walked under
// the fallback's device rules, its outputs sized by its Meta kernel and
// allocated from the graph's pool (in-place and out= outputs are the
// arguments themselves; views of arguments are views of the same device
// storage), and the task that calls its CPU kernel on CPU aliases is the
// task the graph records, so capture is "record instead of push". Replay
// enqueues the whole list as ONE task on the current stream, so the host cost
// of a replay does not grow with the number of ops, and the work runs in
// capture order on the stream worker, asynchronously to the host. Ops that
// must run on the host (Note [Compute on the stream]: data-dependent output
// shapes such as nonzero or masked_select, no meta kernel, host values) and
// out= arguments a capture would resize cannot be captured and raise. A host
// wait on the capturing stream (synchronize, .item(), .cpu(), a blocking
// host->device copy, a random op, which reads the generator on the host)
// raises CUDA's "operation not permitted when stream is capturing" and
// invalidates the capture, which capture_end then reports. Like CUDA, the
// graph works on the tensors it saw at capture: later replays read whatever
// those addresses hold then (CPU scalars as they were at capture, as CUDA's
// kernel arguments). Collectives cannot be captured (the collective backend
// raises).

// Note [NPU graph memory]
// Every device allocation made while the current stream is capturing comes
// from the graph's pool: a block of the ordinary device allocator that the
// pool keeps alive (with any tensor still using it) until the pool goes
// away, so outputs and temporaries keep their addresses across replays and
// replays allocate nothing. Unlike CUDA's private pools, blocks freed during
// capture are not reused by later allocations of the same capture: it costs
// memory, never correctness. Graphs passing the same pool id share one pool,
// which stays alive while any of them does (make_graphed_callables relies on
// that: the backward graph reads activations the forward graph wrote).

namespace {

std::atomic<uint64_t> g_next_pool_uid{1};

std::mutex& g_graph_pools_mutex = *new std::mutex();
std::map<c10::MempoolId_t, std::weak_ptr<GraphPool>>& g_graph_pools =
    *new std::map<c10::MempoolId_t, std::weak_ptr<GraphPool>>();

std::shared_ptr<GraphPool> pool_for(c10::MempoolId_t id) {
  std::lock_guard<std::mutex> lock(g_graph_pools_mutex);
  if (id.first == 0 && id.second == 0) {
    id = {g_next_pool_uid.fetch_add(1), 0};  // a graph's own pool, as CUDA numbers them
  }
  if (auto existing = g_graph_pools[id].lock()) {
    return existing;
  }
  auto pool = std::make_shared<GraphPool>();
  pool->id = id;
  g_graph_pools[id] = pool;
  return pool;
}

}  // namespace

// ---- the capture and its pool --------------------------------------------------

c10::DataPtr GraphPool::allocate(c10::DeviceIndex device, size_t nbytes) {
  auto block = std::make_shared<c10::DataPtr>(allocate_device(device, nbytes));
  void* ptr = block->get();
  {
    std::lock_guard<std::mutex> lock(mutex);
    blocks.push_back(block);
  }
  // The tensor shares ownership: a pool dropped by reset() must not free
  // memory that a static output still points to.
  auto* owner = new std::shared_ptr<c10::DataPtr>(std::move(block));
  return c10::DataPtr(ptr, owner,
      [](void* ctx) { delete static_cast<std::shared_ptr<c10::DataPtr>*>(ctx); },
      c10::Device(c10::DeviceType::PrivateUse1, device));
}

void GraphCapture::append(GraphTask task) {
  std::lock_guard<std::mutex> lock(mutex);
  tasks.push_back(std::move(task));
}

void GraphCapture::invalidate(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (invalidated.empty()) {
      invalidated = message;
    }
  }
  TORCH_CHECK(false, message);
}

void GraphCapture::add_task(std::function<void()> fn, double duration_us, const char* op) {
  append(GraphTask{std::move(fn), duration_us, op});
}

void GraphCapture::refuse_host_wait(const NpuStream& stream, const char* op) {
  invalidate(c10::str("operation not permitted when stream is capturing: ", op,
      " waits on ", stream.name(), ", which an npu graph is capturing (no host synchronization "
      "or host read of device data is possible during capture)"));
}

// ---- the graph --------------------------------------------------------------

c10::MempoolId_t graph_pool_handle() {
  return {0, g_next_pool_uid.fetch_add(1)};  // user handles, as CUDA numbers them
}

bool stream_is_capturing(const NpuStream& stream) {
  return stream.capture() != nullptr;
}

NpuGraph::NpuGraph() = default;

NpuGraph::~NpuGraph() {
  if (capture_) {
    end_capture();  // destroyed mid-capture (an exception unwound the capture)
  }
}

void NpuGraph::capture_begin(c10::MempoolId_t pool, const std::string& mode) {
  TORCH_CHECK(!capture_, "NPUGraph.capture_begin: this graph is already capturing on ", stream_->name());
  TORCH_CHECK(!tasks_, "NPUGraph.capture_begin: this graph already holds a captured graph; "
      "call reset() or create a new NPUGraph to capture again");
  TORCH_CHECK(mode == "default" || mode == "global" || mode == "thread_local" || mode == "relaxed",
      "NPUGraph.capture_begin: capture_error_mode must be one of 'default', 'global', "
      "'thread_local', 'relaxed'; got '", mode, "'");
  const c10::DeviceIndex device = current_device();
  NpuStream& stream = current_stream(device);
  // As CUDA: capture needs a side stream; replay may then run on any stream.
  TORCH_CHECK(stream.id() != 0, "NPUGraph.capture_begin: npu graphs must be captured on a "
      "non-default stream (current: ", stream.name(), "); use `with torch.npu.graph(g)` or "
      "`with torch.npu.stream(torch.npu.Stream())`. Replay may then run on the default stream.");
  TORCH_CHECK(stream.capture() == nullptr, "NPUGraph.capture_begin: ", stream.name(),
      " is already being captured by another graph");
  capture_ = std::make_unique<GraphCapture>();
  capture_->pool = pool_for(pool);
  capture_->stream = &stream;
  stream_ = &stream;
  device_ = device;
  pool_ = capture_->pool;
  // The graph calls down into the floors below (as CUDA's capture_begin calls
  // beginAllocateToPool): the allocator serves the stream's allocations from
  // the pool, the stream records its tasks (compute ops' launches among them).
  begin_allocate_to_pool(stream, pool_.get());
  stream.set_capture(capture_.get());
}

void NpuGraph::end_capture() {
  stream_->set_capture(nullptr);
  end_allocate_to_pool(*stream_);
}

void NpuGraph::capture_end() {
  TORCH_CHECK(capture_, "NPUGraph.capture_end: no capture is underway (call capture_begin first)");
  NpuStream& current = current_stream(device_);
  TORCH_CHECK(&current == stream_, "NPUGraph.capture_end: capture must end on the stream it began on (",
      stream_->name(), "), but the current stream is ", current.name());
  end_capture();
  std::unique_ptr<GraphCapture> capture = std::move(capture_);
  if (!capture->invalidated.empty()) {
    pool_.reset();
    TORCH_CHECK(false, "NPUGraph.capture_end: the capture on ", stream_->name(),
        " was invalidated by a call that is not permitted during capture: ", capture->invalidated);
  }
  if (capture->tasks.empty()) {
    TORCH_WARN("The npu graph is empty: nothing was issued on ", stream_->name(),
        " during capture (work on another stream or device is not captured).");
  }
  tasks_ = std::make_shared<const std::vector<GraphTask>>(std::move(capture->tasks));
}

void NpuGraph::replay() {
  TORCH_CHECK(tasks_, "NPUGraph.replay: the graph has not been captured (call capture_begin and "
      "capture_end, or use `with torch.npu.graph(g)`, first)");
  current_stream(device_).enqueue([tasks = tasks_] {
    for (const GraphTask& task : *tasks) {
      if (task.duration_us > 0) {  // the timing model's duration, as on a stream
        std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double, std::micro>(task.duration_us)));
      }
      task.fn();
    }
  });
}

void NpuGraph::reset() {
  if (capture_) {
    end_capture();
    capture_.reset();
  }
  tasks_.reset();
  pool_.reset();
}

c10::MempoolId_t NpuGraph::pool() const {
  TORCH_CHECK(pool_, "NPUGraph.pool: called without a preceding capture");
  return pool_->id;
}

size_t NpuGraph::num_tasks() const {
  return tasks_ ? tasks_->size() : 0;
}

void NpuGraph::debug_dump(const std::string& path) const {
  TORCH_CHECK(debug_, "NPUGraph.debug_dump: call enable_debug_mode() before capture_begin");
  TORCH_CHECK(tasks_, "NPUGraph.debug_dump: the graph has not been captured");
  std::ofstream out(path);
  TORCH_CHECK(out, "NPUGraph.debug_dump: cannot write ", path);
  out << "npu graph on npu:" << static_cast<int>(device_) << ", pool (" << pool_->id.first << ", "
      << pool_->id.second << "), " << tasks_->size() << " tasks\n";
  for (size_t i = 0; i < tasks_->size(); ++i) {
    out << i << "\t" << (*tasks_)[i].label << "\t" << (*tasks_)[i].duration_us << " us\n";
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
