// Recording of one fallback op into an npu graph capture: the op runs on the
// Meta device for its output shapes, its fresh outputs come from the graph's
// pool, and a task that runs its CPU kernel on CPU aliases is recorded.
#include "op_recorder.h"

#include "capture.h"

#include "../aten/host_transfer.h"
#include "../aten/op_arguments.h"
#include "../runtime/device_allocator.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <unordered_map>

namespace npusim {
namespace {

// The device tensors of one op call and their CPU (replay) and Meta (shape)
// stand-ins; views of one storage share one stand-in storage.
class OpRecorder {
 public:
  explicit OpRecorder(const c10::OperatorHandle& op) : op_(op), rules_(op) {}

  // Walks one argument under the device rules (the fallback's walk,
  // op_arguments.h) into its CPU (replay) and Meta (shape) forms.
  void add_argument(const c10::IValue& v, const c10::Argument& arg) {
    const ArgUse use = use_of(arg);
    CpuSide cpu{*this};
    cpu_args_.push_back(map_argument(v, use, cpu));
    MetaSide meta{*this};
    meta_args_.push_back(map_argument(v, use, meta));
    generator_slots_.push_back(is_optional_generator(arg));
  }

  // The op's npu, once every argument is walked.
  c10::DeviceIndex device() const {
    return rules_.device();
  }

  // Runs the op on Meta; returns the device outputs and records the task.
  std::vector<c10::IValue> record(GraphCapture& capture) {
    capture_ = &capture;
    device_ = device();
    for (size_t i = 0; i < generator_slots_.size(); ++i) {
      if (generator_slots_[i]) {
        // As the eager fallback does: a CPU generator seeded from the npu one.
        cpu_args_[i] = c10::IValue(cpu_generator_argument(cpu_args_[i], rules_));
      }
    }
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
    capture_->append(GraphTask{[call] { call->run(); }, 0.0, name});
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
    capture_->invalidate(message);
  }

  // map_argument's callbacks for the two forms; both walk the same
  // arguments in the same order, so the Meta side takes the stand-ins the
  // CPU side made.
  struct CpuSide {
    OpRecorder& r;
    at::Tensor tensor(const at::Tensor& t, ArgUse use) {
      if (!r.rules_.admit(t, use)) {
        // Host scalars and indices go to the kernels as they are (TensorIterator
        // accepts CPU scalars next to any device).
        return t;
      }
      return r.add_tensor(t);
    }
    c10::IValue device(c10::Device d) {
      r.rules_.admit_device(d);
      return c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
  };
  struct MetaSide {
    OpRecorder& r;
    at::Tensor tensor(const at::Tensor& t, ArgUse) {
      if (!t.defined() || t.device().type() != kNpu) {
        return t;
      }
      return r.inputs_[r.next_meta_++].first;
    }
    c10::IValue device(c10::Device) {
      return c10::IValue(c10::Device(c10::DeviceType::Meta));
    }
  };

  // The CPU alias of npu tensor `t` (views of one storage share one CPU
  // storage) and its Meta stand-in, kept in inputs_.
  at::Tensor add_tensor(const at::Tensor& t) {
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    auto it = cpu_storages_.find(key);
    if (it == cpu_storages_.end()) {
      it = cpu_storages_.emplace(key, cpu_storage_over(t.storage())).first;
      keep_alive_.push_back(t.storage());
    }
    inputs_.emplace_back(meta_over(t), t);
    return cpu_alias_over(t, it->second);
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
          capture_->pool->allocate(device_, nbytes), device_allocator(), /*resizable=*/true);
      fresh = fresh_storages_.emplace(key, storage).first;
      keep_alive_.push_back(storage);
    }
    at::Tensor out = device_tensor_over(fresh->second, meta);
    fresh_.push_back(Fresh{ret, elem, cpu_alias(out)});
    return out;
  }

  const c10::OperatorHandle& op_;
  DeviceRules rules_;
  GraphCapture* capture_ = nullptr;  // set by record()
  c10::DeviceIndex device_ = -1;  // set by record()
  std::vector<c10::IValue> cpu_args_;
  std::vector<bool> generator_slots_;
  size_t next_meta_ = 0;
  std::vector<c10::IValue> meta_args_;
  std::vector<std::pair<at::Tensor, at::Tensor>> inputs_;  // (meta, device) per npu argument
  std::unordered_map<c10::StorageImpl*, c10::Storage> cpu_storages_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> meta_storages_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> meta_to_device_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> fresh_storages_;
  std::vector<Fresh> fresh_;
  std::vector<c10::Storage> keep_alive_;
};

}  // namespace

bool capture_fallback_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  OpRecorder recorder(op);
  for (size_t i = 0; i < arguments.size(); ++i) {
    recorder.add_argument((*stack)[first + i], arguments[i]);
  }
  auto* capture = dynamic_cast<GraphCapture*>(current_stream(recorder.device()).capture());
  if (capture == nullptr) {
    return false;
  }
  std::vector<c10::IValue> outputs = recorder.record(*capture);
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (c10::IValue& v : outputs) {
    stack->push_back(std::move(v));
  }
  return true;
}

}  // namespace npusim
