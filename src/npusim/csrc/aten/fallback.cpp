// The stream-ordered CPU fallback: every op without an npu kernel runs with
// PyTorch's CPU kernel on CPU views of the device memory, in place, after the
// current stream's earlier work.
#include "fallback.h"

#include "cpu_aliases.h"
#include "fallback_call.h"
#include "generator.h"
#include "host_transfer.h"
#include "launch/op_launch.h"
#include "../runtime/device_allocator.h"
#include "../runtime/stream.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <algorithm>
#include <typeinfo>

namespace npusim {

// Note [Device rules of the fallback] is in op_arguments.h, whose walk graph
// capture shares.

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
// fallback]) are unchanged.
//
// The second round (issue 15, per-op cost) found more outside the fallback
// than in it. Instructions per a.add(b) on 64 floats (callgrind, counting
// only a functools.reduce loop of the op: its Python call, the op and the
// release of its result; CPU: 10.7k throughout):
//   24.4k  before (2.28x). The composite add.Tensor kernel alone was 16.6k:
//          its meta (TensorIterator, npu output) 8.0k, then add.out into
//          the fallback 11.1k (CPU kernel 3.9k, aliases 2.6k); the free of
//          the result 2.1k, 1.5k of it scanning every stream for work.
//   17.8k  structured ops' functional and in-place variants straight to the
//          fallback (Note [Structured ops go straight to the fallback],
//          fallback_routes.cpp), their outputs from the npu caching
//          allocator (Note [CPU kernels allocate device memory], cpu_allocator.cpp:
//          about 3k fewer than adopting host memory, which would also have
//          changed the memory statistics), the fresh result turned into the
//          npu tensor itself (back()), and a count of unfinished stream tasks
//          that lets a free skip the scan when there are none (stream.cpp).
//   16.9k  reused CPU aliases (Note [Reused CPU aliases]).
//   14.6k  unboxed kernels for the hottest ops (Note [Unboxed fallback
//          kernels]): no boxing, and no GIL taken for the boxed copy of an
//          argument only Python held.
//   13.2k  (1.24x) smaller things: lent blocks found through the pool's map
//          of segments instead of a map of their own, resizes looked for
//          only on written arguments, the statistics update written out, the
//          observer scope only when an observer is set, aliases reset only
//          where they differ, the streams table behind a function-local
//          static instead of std::call_once.
// What is left over CPU: the two aliases (1.2k), the npu allocation and its
// release (the caching allocator's lock and statistics), the result's
// conversion (0.6k) and the stream check. For add, sub, mul and div the
// host path no longer comes here at all: Note [TensorIterator kernels on
// npu tensors] (iterator_kernels.cpp) runs CPU's kernel class on the npu
// tensors, with no aliases and no conversion.

// Note [Reused CPU aliases] is in cpu_aliases.cpp.

// ---- one call -----------------------------------------------------------------

c10::IValue FallbackCall::to_cpu(c10::IValue&& v, const c10::Argument& arg) {
  if (v.isTensor() || v.isTensorList() || v.isOptionalTensorList()) {
    // Kept for the call: the aliases refer to the tensors (and list elements) by pointer.
    originals_.push_back(std::move(v));
    return map_argument(originals_.back(), use_of(arg), *this);
  }
  return map_argument(v, use_of(arg), *this);
}

at::Tensor FallbackCall::alias(const at::Tensor& t, Use use) {
  if (!rules_.admit(t, use)) {
    if (t.defined()) {
      // A CPU scalar or index runs as it is in the CPU kernel; its memory stays the caller's.
      callers_.push_back(t.storage().unsafeGetStorageImpl());
    }
    return t;
  }
  const bool written = use == Use::kWritten;
  // The same tensor twice (an in-place composite calls X.out(self, self, other)) is one CPU tensor: CPU's
  // kernel tells an in-place call by it (TensorIterator refuses to resize an output it also reads, "output with
  // shape [5, 1] doesn't match the broadcast shape [5, 5]"), where two aliases made it resize self.
  for (TensorEntry& e : tensors_) {
    if (e.device == t.unsafeGetTensorImpl()) {
      e.written = e.written || written;
      for (StorageEntry& s : storages_) {
        if (s.device == t.storage().unsafeGetStorageImpl()) {
          s.written = s.written || written;
        }
      }
      return e.cpu;
    }
  }
  c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
  StorageEntry* shared = nullptr;
  for (StorageEntry& e : storages_) {
    if (e.device == key) {
      shared = &e;
      shared->written = shared->written || written;
      break;
    }
  }
  at::Tensor cpu_tensor = take_cpu_alias(AliasSource::of(t), shared != nullptr ? &shared->cpu : nullptr);
  if (shared == nullptr) {
    const c10::Storage& cpu = cpu_tensor.storage();
    storages_.push_back(StorageEntry{key, cpu, cpu.data(), written});
  }
  tensors_.push_back(TensorEntry{t.unsafeGetTensorImpl(), cpu_tensor, written});
  return cpu_tensor;
}

c10::IValue FallbackCall::from_cpu(const c10::IValue& v) {
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

void FallbackCall::propagate_resizes() {
  // out= kernels may have resized an output: move the new bytes and shape
  // back to the device tensors. Only written arguments can change.
  for (StorageEntry& entry : storages_) {
    c10::StorageImpl* cpu = entry.cpu.unsafeGetStorageImpl();
    if (!entry.written || (cpu->data() == entry.original_data && cpu->nbytes() == entry.device->nbytes())) {
      continue;
    }
    const size_t nbytes = cpu->nbytes();
    c10::DataPtr moved = cpu->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
    entry.device->set_data_ptr_noswap(as_device_memory(std::move(moved), nbytes, device()));
    entry.device->set_nbytes(nbytes);
  }
  for (TensorEntry& entry : tensors_) {
    c10::TensorImpl* device_impl = entry.device;
    const at::Tensor& cpu_tensor = entry.cpu;
    if (entry.written &&
        (!device_impl->sizes().equals(cpu_tensor.sizes()) || !device_impl->strides().equals(cpu_tensor.strides()) ||
            device_impl->storage_offset() != cpu_tensor.storage_offset())) {
      device_impl->set_sizes_and_strides(cpu_tensor.sizes(), cpu_tensor.strides(), cpu_tensor.storage_offset());
    }
  }
}

at::Tensor FallbackCall::back(const at::Tensor& t) {
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
    // its memory is not ours to adopt, so the result gets a copy (of
    // device memory, as the kernel's own outputs).
    const CpuAllocationsOnDevice on_device(device());
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
  if (!device_storage && t.use_count() == 1 && t.storage().use_count() == 1 &&
      typeid(*t.unsafeGetTensorImpl()) == typeid(c10::TensorImpl)) {
    // A fresh result that nothing else refers to becomes the npu tensor
    // itself: no second TensorImpl and storage to build and the CPU ones
    // to destroy.
    const size_t nbytes = cpu_storage->nbytes();
    c10::DataPtr moved = cpu_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
    cpu_storage->set_data_ptr_noswap(as_device_memory(std::move(moved), nbytes, device()));
    cpu_storage->set_allocator(device_allocator());
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    impl->set_storage_keep_dtype(t.storage());  // its device now follows the storage's
    impl->_change_backend_component_keys(cpu_storage->device());
    return t;
  }
  if (!device_storage) {
    const size_t nbytes = cpu_storage->nbytes();
    c10::DataPtr moved = cpu_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
    c10::Storage adopted(c10::Storage::use_byte_size_t(), nbytes,
        as_device_memory(std::move(moved), nbytes, device()), device_allocator(),
        /*resizable=*/true);
    fresh_.emplace_back(cpu_storage, adopted);
    device_storage = std::move(adopted);
  }
  return tensor_over(std::move(device_storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), t);
}

// ---- the boxed fallback ---------------------------------------------------------

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (launch_boxed(op, stack)) {
    return;  // a task on the op's stream (or recorded by the graph capturing it): Note [Compute on the stream]
  }
  // On the host, after the stream's earlier work.
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t first = stack->size() - num_args;
  FallbackCall call(op);
  for (size_t i = 0; i < num_args; ++i) {
    (*stack)[first + i] = call.to_cpu(std::move((*stack)[first + i]), schema.arguments()[i]);
  }
  for (size_t i = 0; i < num_args; ++i) {
    if (is_optional_generator(schema.arguments()[i])) {
      c10::IValue& arg = (*stack)[first + i];
      arg = c10::IValue(cpu_generator_argument(arg, call.rules()));
    }
  }
  call.run([&] { op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack); });
  const size_t num_returns = schema.returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    (*stack)[i] = call.from_cpu((*stack)[i]);
  }
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Composites that would stand in for CPU's own kernel (native_layer_norm's
  // math version, mse_loss's structured composite) are routed by
  // fallback_routes.cpp (Note [CPU's kernel, not the composite]).
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
