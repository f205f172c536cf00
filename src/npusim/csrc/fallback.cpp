// The stream-ordered CPU fallback: every op without an npu kernel runs with
// PyTorch's CPU kernel on CPU views of the device memory, in place, after the
// current stream's earlier work.
#include "fallback.h"

#include "device_hooks.h"
#include "generator.h"
#include "graph.h"
#include "memory.h"
#include "runtime.h"
#include "host_transfer.h"
#include "intraop_threads.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <c10/util/SmallVector.h>

#include <algorithm>

namespace npusim {
namespace {

// ---- the fallback ---------------------------------------------------------

// Note [Device rules of the fallback]
// CPU kernels accept any CPU tensor, so without a check a CPU tensor given
// to an npu op would be computed on (or, as a result, adopted as device
// memory). npu follows CUDA instead (see Note [npu follows CUDA where CPU
// differs] in cuda_semantics.cpp): the tensors of one op are on one npu,
// except that a CPU 0-dim tensor may be read as a scalar (TensorIterator's
// rule) and indices (Tensor?[] of index / index_put_) may be on CPU (CUDA's
// indexing moves them); anything else raises CUDA's "Expected all tensors
// to be on the same device" before the kernel runs, so an out= tensor on the
// wrong device is never written. A result over a caller's CPU tensor is
// copied, never adopted: its memory belongs to the caller.

// Note [Cost of the fallback]
// Every npu op without its own kernel comes through here, so the per-op host
// cost is the simulator's floor (issue 15). Measured with callgrind on
// a.add(b) (64 floats), much of the fallback's own cost was bookkeeping
// rather than work: hash-map and hash-set nodes allocated and freed per call,
// a growing vector, extra copies (atomic reference counts) of the npu
// argument tensors and storages, a shared_ptr copy per argument in the
// generator scan, and a device switch through the guard when the device was
// already current. Hence: the npu arguments are moved off the stack into
// `originals_` (which keeps them alive for the call) and referred to by raw
// pointer; ops have a handful of tensors, so lookups are linear scans of
// small inline vectors; the guard only switches when the op's device is not
// the current one. The rules themselves (Note [Device rules of the
// fallback]) are unchanged. What remains is mostly the CPU kernel itself and
// one CPU storage and TensorImpl per tensor argument (cpu_alias_over).

// Runs an op that has no npu kernel with PyTorch's CPU kernel on CPU views of
// the device memory: after the current stream's earlier work, synchronously.
class FallbackCall {
 public:
  FallbackCall(const c10::OperatorHandle& op, size_t num_args) : op_(op) {
    originals_.reserve(num_args);
  }

  // `arg` is the schema's argument: written-to arguments (out=, self of an
  // in-place op) must be npu tensors, read ones may also be CPU scalars.
  // Takes the stack's value (kept alive in originals_ for the call).
  c10::IValue to_cpu(c10::IValue&& v, const c10::Argument& arg) {
    const bool written = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    if (v.isTensor()) {
      originals_.push_back(std::move(v));
      return alias(originals_.back().toTensor(), written ? Use::kWritten : Use::kRead);
    }
    if (v.isTensorList()) {
      originals_.push_back(std::move(v));
      c10::List<at::Tensor> in = originals_.back().toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(in.size());
      for (size_t i = 0; i < in.size(); ++i) {
        // The list's elements live in its storage, which originals_ keeps.
        out.push_back(alias(in.get(i), written ? Use::kWritten : Use::kRead));
      }
      return out;
    }
    if (v.isOptionalTensorList()) {
      originals_.push_back(std::move(v));
      c10::List<std::optional<at::Tensor>> in = originals_.back().toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(in.size());
      for (size_t i = 0; i < in.size(); ++i) {
        const std::optional<at::Tensor> t = in.get(i);
        out.push_back(t.has_value() ? std::optional<at::Tensor>(alias(*t, Use::kIndex)) : std::nullopt);
      }
      return out;
    }
    if (v.isDevice() && v.toDevice().type() == kNpu) {
      note_device(c10::Device(kNpu, v.toDevice().index() < 0 ? current_device() : v.toDevice().index()));
      return c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
    return std::move(v);
  }

  c10::DeviceIndex device() const {
    return device_ < 0 ? current_device() : device_;
  }

  // Whether any argument is an npu tensor or device.
  bool on_npu() const {
    return device_ >= 0;
  }

  c10::IValue from_cpu(const c10::IValue& v) {
    if (v.isTensor()) {
      return back(v.toTensor());
    }
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) {
        out.push_back(back(t));
      }
      return out;
    }
    return v;
  }

  // out= kernels may have resized an output: move the new bytes and shape
  // back to the device tensors.
  void propagate_resizes() {
    for (StorageEntry& entry : storages_) {
      c10::StorageImpl* cpu = entry.cpu.unsafeGetStorageImpl();
      if (cpu->data() == entry.original_data && cpu->nbytes() == entry.device->nbytes()) {
        continue;
      }
      const size_t nbytes = cpu->nbytes();
      c10::DataPtr moved = cpu->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
      entry.device->set_data_ptr_noswap(adopt_as_device(std::move(moved), nbytes, device()));
      entry.device->set_nbytes(nbytes);
    }
    for (TensorEntry& entry : tensors_) {
      c10::TensorImpl* device_impl = entry.device;
      const at::Tensor& cpu_tensor = entry.cpu;
      if (!device_impl->sizes().equals(cpu_tensor.sizes()) ||
          !device_impl->strides().equals(cpu_tensor.strides()) ||
          device_impl->storage_offset() != cpu_tensor.storage_offset()) {
        device_impl->set_sizes_and_strides(cpu_tensor.sizes(), cpu_tensor.strides(), cpu_tensor.storage_offset());
      }
    }
  }

 private:
  struct StorageEntry {
    c10::StorageImpl* device;  // kept alive by originals_
    c10::Storage cpu;
    const void* original_data;
  };
  struct TensorEntry {
    c10::TensorImpl* device;  // kept alive by originals_
    at::Tensor cpu;
  };

  // How an op uses a tensor argument; see Note [Device rules of the fallback].
  enum class Use { kRead, kWritten, kIndex };

  void note_device(c10::Device d) {
    if (!first_device_) {
      first_device_ = d;
    }
    if (d.type() == kNpu && device_ < 0) {
      device_ = d.index();
    }
    TORCH_CHECK(d == *first_device_,
        "Expected all tensors to be on the same device, but found at least two devices, ",
        *first_device_, " and ", d, "! (when running ", op_.schema().operator_name(), ")");
  }

  at::Tensor alias(const at::Tensor& t, Use use) {
    if (!t.defined()) {
      return t;
    }
    if (t.device().type() != kNpu) {
      // CPU scalars (0-dim) are read as values, as CUDA's TensorIterator
      // does, and CPU indices are moved by CUDA's indexing kernels; both run
      // as they are in the CPU kernel. Their memory stays the caller's.
      const bool accepted = t.is_cpu() &&
          ((use == Use::kRead && t.dim() == 0) || use == Use::kIndex);
      if (!accepted) {
        note_device(t.device());
      }
      callers_.push_back(t.storage().unsafeGetStorageImpl());
      return t;
    }
    note_device(t.device());
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    StorageEntry* entry = nullptr;
    for (StorageEntry& e : storages_) {
      if (e.device == key) {
        entry = &e;
        break;
      }
    }
    if (entry == nullptr) {
      c10::Storage cpu = cpu_storage_over(t.storage());
      const void* data = cpu.data();
      storages_.push_back(StorageEntry{key, std::move(cpu), data});
      entry = &storages_.back();
    }
    at::Tensor cpu_tensor = cpu_alias_over(t, entry->cpu);
    tensors_.push_back(TensorEntry{t.unsafeGetTensorImpl(), cpu_tensor});
    return cpu_tensor;
  }

  at::Tensor back(const at::Tensor& t) {
    if (!t.defined() || !t.is_cpu()) {
      return t;
    }
    // npu tensors are strided only: a sparse (or other) result of the CPU
    // kernel has no storage to move to the device. Say so instead of
    // "Cannot access storage of SparseTensorImpl" (found by the OpInfo sweep).
    TORCH_CHECK(t.layout() == c10::kStrided, op_.schema().operator_name(),
        ": npu tensors support only the strided layout, but this op's result has layout ", t.layout(),
        "; run sparse ops on cpu");
    for (const TensorEntry& entry : tensors_) {
      if (entry.cpu.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        // in-place and out= ops return their argument
        return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(entry.device));
      }
    }
    c10::StorageImpl* cpu_storage = t.storage().unsafeGetStorageImpl();
    c10::Storage device_storage;
    for (const StorageEntry& entry : storages_) {
      if (entry.cpu.unsafeGetStorageImpl() == cpu_storage) {
        // a view of an input
        device_storage = c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(entry.device));
      }
    }
    if (!device_storage &&
        std::find(callers_.begin(), callers_.end(), cpu_storage) != callers_.end()) {
      // A result over a caller's CPU tensor (a CPU scalar passed through):
      // its memory is not ours to adopt, so the result gets a copy.
      return back(t.clone());
    }
    if (!device_storage) {
      for (const auto& [cpu, adopted] : fresh_) {
        if (cpu == cpu_storage) {
          device_storage = adopted;
          break;
        }
      }
    }
    if (!device_storage) {
      const size_t nbytes = cpu_storage->nbytes();
      c10::DataPtr moved =
          cpu_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
      c10::Storage adopted(c10::Storage::use_byte_size_t(), nbytes,
          adopt_as_device(std::move(moved), nbytes, device()), device_allocator(),
          /*resizable=*/true);
      fresh_.emplace_back(cpu_storage, adopted);
      device_storage = std::move(adopted);
    }
    return tensor_over(std::move(device_storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), t);
  }

  const c10::OperatorHandle& op_;
  std::optional<c10::Device> first_device_;
  c10::DeviceIndex device_ = -1;
  // The stack's arguments, moved here: they keep the npu tensors (and
  // storages) that the entries below point to alive for the call.
  c10::SmallVector<c10::IValue, 6> originals_;
  c10::SmallVector<const c10::StorageImpl*, 2> callers_;
  c10::SmallVector<StorageEntry, 4> storages_;
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 2> fresh_;
  c10::SmallVector<TensorEntry, 4> tensors_;
};

// The generator a CPU kernel of a random op draws from: a CPU generator
// seeded from the npu generator's Philox state (Note [npu Philox stream]),
// never the CPU default generator. Generators of the wrong device type get
// CUDA's errors.
at::Generator fallback_generator(
    const c10::IValue& arg, c10::DeviceIndex device, bool on_npu, const c10::FunctionSchema& schema) {
  std::optional<at::Generator> gen;
  if (!arg.isNone()) {
    gen = arg.toGenerator();
  }
  if (!on_npu) {
    // Only an npu generator's dispatch key brings an op without npu tensors here.
    TORCH_CHECK(false, "Expected a 'cpu' device type for generator but found '",
        gen.has_value() ? gen->device().type() : kNpu, "' (when running ", schema.operator_name(), ")");
  }
  return cpu_generator_for(gen, device);
}

}  // namespace

bool is_optional_generator(const c10::Argument& arg) {
  // castRaw: no shared_ptr copy (an atomic increment) per argument per op.
  const auto* opt = arg.type()->castRaw<c10::OptionalType>();
  return opt != nullptr && opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (capture_fallback_op(op, stack)) {
    return;  // recorded into the npu graph capturing the current stream
  }
  follow_user_intraop_threads();  // Note [Intra-op threads of autograd's npu thread]
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t first = stack->size() - num_args;
  FallbackCall call(op, num_args);
  for (size_t i = 0; i < num_args; ++i) {
    (*stack)[first + i] = call.to_cpu(std::move((*stack)[first + i]), schema.arguments()[i]);
  }
  const c10::DeviceIndex device = call.device();
  for (size_t i = 0; i < num_args; ++i) {
    if (is_optional_generator(schema.arguments()[i])) {
      c10::IValue& arg = (*stack)[first + i];
      arg = c10::IValue(fallback_generator(arg, device, call.on_npu(), schema));
    }
  }
  wait_current_stream_idle(device);
  // Switch only when needed: the guard's exchange costs two device calls.
  c10::OptionalDeviceGuard guard;
  if (current_device() != device) {
    guard.reset_device(c10::Device(kNpu, device));
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  call.propagate_resizes();
  const size_t num_returns = schema.returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    (*stack)[i] = call.from_cpu((*stack)[i]);
  }
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Without these the PrivateUse1 slot gets a composite kernel instead of
  // CPU's own: native_layer_norm's math version runs batch_norm (slower), and
  // mse_loss's structured composite resizes a 0-dim output (a UserWarning).
  m.impl("native_layer_norm", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  // Convolutions: PyTorch routes a PrivateUse1 tensor to
  // convolution_overrideable, which has no kernel; taking the convolution
  // entry points themselves gives CPU's convolution (and its backward) on the
  // device memory.
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("_convolution", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}

}  // namespace npusim
