// NPU graphs: capture of the device work issued on a stream, replay of it as
// one stream task, and the graph's private memory pool.
#include "graph.h"

#include "device_hooks.h"
#include "fallback.h"
#include "generator.h"
#include "host_transfer.h"
#include "memory.h"

#include <ATen/ATen.h>
#include <ATen/core/GraphImplInterface.h>
#include <c10/util/Exception.h>

#include <fstream>
#include <map>
#include <mutex>
#include <unordered_map>

namespace npusim {

// Note [NPU graph capture]
// A stream is a FIFO of host functions run by its worker (runtime.h). While a
// graph captures a stream, NpuStream::enqueue appends the function to the
// graph instead of queueing it: copies, foreach copies, batched memcpy and
// event records issued on that stream are recorded without running, as on
// CUDA. Compute does not go through enqueue (the boxed fallback runs CPU
// kernels synchronously), so the fallback asks capture_fallback_op first:
// on a capturing stream the op is run on the Meta device to learn its output
// sizes, strides and dtypes; fresh outputs are allocated from the graph's
// pool (in-place and out= outputs are the arguments themselves; views of
// arguments are views of the same device storage), and a task is recorded
// that calls the op's CPU kernel boxed on CPU aliases of the arguments and
// copies its fresh results into those pool outputs. Replay enqueues the whole
// list as ONE task on the current stream, so the host cost of a replay does
// not grow with the number of ops, and the work runs in capture order on the
// stream worker, asynchronously to the host. Ops whose output shapes depend
// on data (nonzero, masked_select) or that lack a meta kernel cannot be
// captured and raise. A host wait on the capturing stream (synchronize,
// .item(), .cpu(), a blocking host->device copy) raises CUDA's "operation not
// permitted when stream is capturing" and invalidates the capture, which
// capture_end then reports. Like CUDA, the graph works on the tensors it saw
// at capture: later replays read whatever those addresses hold then.
// Collectives cannot be captured (the collective backend raises).

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

std::atomic<int> g_captures_underway{0};
std::atomic<uint64_t> g_next_pool_uid{1};

}  // namespace

struct GraphPool {
  c10::MempoolId_t id;
  std::mutex mutex;
  std::vector<std::shared_ptr<c10::DataPtr>> blocks;

  c10::DataPtr allocate(c10::DeviceIndex device, size_t nbytes) {
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
};

struct GraphCapture {
  std::mutex mutex;
  std::vector<GraphTask> tasks;
  std::shared_ptr<GraphPool> pool;
  NpuStream* stream = nullptr;
  std::string invalidated;  // the first forbidden call, if any
};

namespace {

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

void append(GraphCapture& capture, GraphTask task) {
  std::lock_guard<std::mutex> lock(capture.mutex);
  capture.tasks.push_back(std::move(task));
}

// ---- recording one fallback op ----------------------------------------------

// The device tensors of one op call and their CPU (replay) and Meta (shape)
// stand-ins; views of one storage share one stand-in storage.
class OpRecorder {
 public:
  OpRecorder(const c10::OperatorHandle& op, GraphCapture& capture, c10::DeviceIndex device)
      : op_(op), capture_(capture), device_(device) {}

  // The CPU and Meta forms of one element of a tensor-list argument.
  std::pair<at::Tensor, at::Tensor> list_element(const at::Tensor& t) {
    add_tensor(t);
    std::pair<at::Tensor, at::Tensor> out{cpu_args_.back().toTensor(), meta_args_.back().toTensor()};
    cpu_args_.pop_back();
    meta_args_.pop_back();
    return out;
  }

  void add_argument(const c10::IValue& v, bool generator_slot) {
    if (v.isTensor()) {
      add_tensor(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> cpu, meta;
      for (const at::Tensor& t : v.toTensorList()) {
        auto [c, m] = list_element(t);
        cpu.push_back(std::move(c));
        meta.push_back(std::move(m));
      }
      cpu_args_.emplace_back(cpu);
      meta_args_.emplace_back(meta);
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> cpu, meta;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (!t.has_value()) {
          cpu.push_back(std::nullopt);
          meta.push_back(std::nullopt);
          continue;
        }
        auto [c, m] = list_element(*t);
        cpu.push_back(std::move(c));
        meta.push_back(std::move(m));
      }
      cpu_args_.emplace_back(cpu);
      meta_args_.emplace_back(meta);
    } else if (v.isDevice() && v.toDevice().type() == kNpu) {
      cpu_args_.emplace_back(c10::Device(c10::DeviceType::CPU));
      meta_args_.emplace_back(c10::Device(c10::DeviceType::Meta));
    } else if (generator_slot) {
      // As the eager fallback does: a CPU generator seeded from the npu one.
      cpu_args_.emplace_back(cpu_generator_for(
          v.isNone() ? std::nullopt : std::optional<at::Generator>(v.toGenerator()), device_));
      meta_args_.emplace_back(v);
    } else {
      cpu_args_.push_back(v);
      meta_args_.push_back(v);
    }
  }

  // Runs the op on Meta; returns the device outputs and records the task.
  std::vector<c10::IValue> record() {
    const std::string name = c10::toString(op_.schema().operator_name());
    torch::jit::Stack meta_stack(meta_args_);
    try {
      op_.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
    } catch (const std::exception& e) {
      invalidate("npu graph capture: " + name +
          " cannot be captured: its output shapes could not be computed on the meta device "
          "(data-dependent shape or no meta kernel): " + first_line(e.what()));
    }
    for (const auto& [meta, device] : inputs_) {
      if (!meta.sizes().equals(device.sizes()) || !meta.strides().equals(device.strides())) {
        invalidate("npu graph capture: " + name + " resizes its output argument from " +
            c10::str(device.sizes()) + " to " + c10::str(meta.sizes()) +
            " during capture; allocate outputs with their final shape before capturing");
      }
    }
    std::vector<c10::IValue> outputs;
    for (size_t i = 0; i < meta_stack.size(); ++i) {
      const c10::IValue& r = meta_stack[i];
      if (r.isTensor()) {
        outputs.emplace_back(output(r.toTensor(), i, -1));
      } else if (r.isTensorList()) {
        c10::List<at::Tensor> list;
        const auto meta_list = r.toTensorList();
        for (size_t j = 0; j < meta_list.size(); ++j) {
          list.push_back(output(meta_list.get(j), i, static_cast<int64_t>(j)));
        }
        outputs.emplace_back(list);
      } else if (r.isNone()) {
        outputs.emplace_back();
      } else {
        invalidate("operation not permitted when stream is capturing: " + name +
            " returns a host value computed from device data");
      }
    }
    auto call = std::make_shared<Call>(Call{op_, std::move(cpu_args_), std::move(fresh_),
        std::move(keep_alive_), device_});
    append(capture_, GraphTask{[call] { call->run(); }, 0.0, name});
    return outputs;
  }

 private:
  struct Fresh {
    size_t ret;
    int64_t elem;  // -1: the return is a tensor, else an index into its list
    at::Tensor dst;  // CPU alias of the pool output
  };
  struct Call {
    c10::OperatorHandle op;
    std::vector<c10::IValue> args;
    std::vector<Fresh> fresh;
    std::vector<c10::Storage> keep_alive;  // the device memory the call reads and writes
    c10::DeviceIndex device;

    void run() const {
      torch::jit::Stack stack(args);
      const c10::DeviceGuard guard(c10::Device(kNpu, device));
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
      for (const Fresh& f : fresh) {
        const c10::IValue& r = stack[f.ret];
        host_copy(f.dst, f.elem < 0 ? r.toTensor() : r.toTensorList().get(f.elem));
      }
    }
  };

  static std::string first_line(const std::string& s) {
    return s.substr(0, s.find('\n'));
  }

  [[noreturn]] void invalidate(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(capture_.mutex);
      if (capture_.invalidated.empty()) {
        capture_.invalidated = message;
      }
    }
    TORCH_CHECK(false, message);
  }

  void add_tensor(const at::Tensor& t) {
    if (!t.defined()) {
      cpu_args_.emplace_back(t);
      meta_args_.emplace_back(t);
      return;
    }
    if (t.device().type() != kNpu) {
      // Host scalars and other host tensors go to the meta kernel as they are
      // (TensorIterator accepts CPU scalars next to any device).
      cpu_args_.emplace_back(t);
      meta_args_.emplace_back(t);
      return;
    }
    at::Tensor meta = meta_over(t);
    {
      c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
      auto it = cpu_storages_.find(key);
      if (it == cpu_storages_.end()) {
        it = cpu_storages_.emplace(key, cpu_storage_over(t.storage())).first;
        keep_alive_.push_back(t.storage());
      }
      cpu_args_.emplace_back(cpu_alias_over(t, it->second));
      inputs_.emplace_back(meta, t);
    }
    meta_args_.emplace_back(meta);
  }

  at::Tensor meta_over(const at::Tensor& t) {
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    auto it = meta_storages_.find(key);
    if (it == meta_storages_.end()) {
      c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
          c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)),
          c10::GetAllocator(c10::DeviceType::Meta), /*resizable=*/true);
      it = meta_storages_.emplace(key, storage).first;
      meta_to_device_.emplace(storage.unsafeGetStorageImpl(), t.storage());
    }
    return tensor_over(c10::Storage(it->second), c10::DispatchKeySet(c10::DispatchKey::Meta), t);
  }

  at::Tensor device_tensor_over(const c10::Storage& storage, const at::Tensor& meta) {
    return tensor_over(c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), meta);
  }

  at::Tensor output(const at::Tensor& meta, size_t ret, int64_t elem) {
    if (!meta.defined()) {
      return meta;
    }
    for (const auto& [meta_in, device_in] : inputs_) {
      if (meta_in.unsafeGetTensorImpl() == meta.unsafeGetTensorImpl()) {
        return device_in;  // in-place and out= ops return their argument
      }
    }
    c10::StorageImpl* key = meta.storage().unsafeGetStorageImpl();
    auto view = meta_to_device_.find(key);
    if (view != meta_to_device_.end()) {
      return device_tensor_over(view->second, meta);  // a view of an argument
    }
    auto fresh = fresh_storages_.find(key);
    if (fresh == fresh_storages_.end()) {
      const size_t nbytes = meta.storage().nbytes();
      c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
          capture_.pool->allocate(device_, nbytes), device_allocator(), /*resizable=*/true);
      fresh = fresh_storages_.emplace(key, storage).first;
      keep_alive_.push_back(storage);
    }
    at::Tensor out = device_tensor_over(fresh->second, meta);
    fresh_.push_back(Fresh{ret, elem, cpu_alias(out)});
    return out;
  }

  const c10::OperatorHandle& op_;
  GraphCapture& capture_;
  const c10::DeviceIndex device_;
  std::vector<c10::IValue> cpu_args_;
  std::vector<c10::IValue> meta_args_;
  std::vector<std::pair<at::Tensor, at::Tensor>> inputs_;  // (meta, device) per npu argument
  std::unordered_map<c10::StorageImpl*, c10::Storage> cpu_storages_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> meta_storages_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> meta_to_device_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> fresh_storages_;
  std::vector<Fresh> fresh_;
  std::vector<c10::Storage> keep_alive_;
};

c10::DeviceIndex npu_device_of(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && t.device().type() == kNpu ? t.device().index() : -1;
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (t.defined() && t.device().type() == kNpu) {
        return t.device().index();
      }
    }
  }
  if (v.isDevice() && v.toDevice().type() == kNpu && v.toDevice().index() >= 0) {
    return v.toDevice().index();
  }
  return -1;
}

}  // namespace

// ---- hooks ------------------------------------------------------------------

void capture_task(GraphCapture& capture, std::function<void()> fn, double duration_us) {
  append(capture, GraphTask{std::move(fn), duration_us, "stream task"});
}

void raise_capturing(GraphCapture& capture, const NpuStream& stream, const char* op) {
  const std::string message = c10::str("operation not permitted when stream is capturing: ", op,
      " waits on ", stream.name(), ", which an npu graph is capturing (no host synchronization "
      "or host read of device data is possible during capture)");
  {
    std::lock_guard<std::mutex> lock(capture.mutex);
    if (capture.invalidated.empty()) {
      capture.invalidated = message;
    }
  }
  TORCH_CHECK(false, message);
}

c10::DataPtr allocate_for_capture(c10::DeviceIndex device, size_t nbytes) {
  if (g_captures_underway.load(std::memory_order_acquire) == 0) {
    return {};
  }
  GraphCapture* capture = current_stream(device).capture();
  if (capture == nullptr) {
    return {};
  }
  return capture->pool->allocate(device, nbytes);
}

bool graph_capture_underway() {
  return g_captures_underway.load(std::memory_order_acquire) != 0;
}

bool capture_fallback_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (g_captures_underway.load(std::memory_order_acquire) == 0) {
    return false;
  }
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  c10::DeviceIndex device = -1;
  for (size_t i = first; i < stack->size() && device < 0; ++i) {
    device = npu_device_of((*stack)[i]);
  }
  if (device < 0) {
    device = current_device();
  }
  GraphCapture* capture = current_stream(device).capture();
  if (capture == nullptr) {
    return false;
  }
  OpRecorder recorder(op, *capture, device);
  for (size_t i = 0; i < arguments.size(); ++i) {
    recorder.add_argument((*stack)[first + i], is_optional_generator(arguments[i]));
  }
  std::vector<c10::IValue> outputs = recorder.record();
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (c10::IValue& v : outputs) {
    stack->push_back(std::move(v));
  }
  return true;
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
  g_captures_underway.fetch_add(1, std::memory_order_acq_rel);
  stream.set_capture(capture_.get());
}

void NpuGraph::end_capture() {
  stream_->set_capture(nullptr);
  g_captures_underway.fetch_sub(1, std::memory_order_acq_rel);
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
