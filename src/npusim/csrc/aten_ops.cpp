// Base aten registrations for the npu device and the stream-ordered CPU
// fallback that runs every other op with PyTorch's CPU kernels on the device
// memory in place.
#include "device_hooks.h"
#include "runtime.h"
#include "tensor_alias.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <unordered_map>

namespace npusim {
namespace {

constexpr auto kNpu = c10::DeviceType::PrivateUse1;

c10::DeviceIndex device_of(std::optional<c10::Device> device) {
  if (!device.has_value() || device->index() < 0) {
    return current_device();
  }
  return device->index();
}

// ---- factories and views --------------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>,
    std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(c10::Device(kNpu, device_of(device)));
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
    std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
    std::optional<c10::Device> device, std::optional<bool>) {
  const c10::DeviceGuard guard(c10::Device(kNpu, device_of(device)));
  return at::detail::empty_strided_generic(
      size, stride, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::dtype_or_default(dtype));
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
    std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  // Growing copies the old bytes on the host: queued writes must land first.
  wait_current_stream_idle(self.device().index());
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
    c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  // `param.data = npu_tensor` (FSDP2 moving CPU parameters) swaps a dense CPU
  // impl for a dense npu impl; both are plain strided TensorImpls.
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.is_cpu() || t.device().type() == kNpu);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
      (dense(self) && dense(from));
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  wait_current_stream_idle(self.device().index());
  return at::_local_scalar_dense(cpu_alias(self));
}

// ---- copies ---------------------------------------------------------------

size_t nbytes_contiguous(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

// Copies between npu and host or between npu devices, with the semantics of
// SPEC.md section 3 (CUDA's Copy.cu): device copies are enqueued on the
// current stream; host<->device honours non_blocking; pageable host sources
// are staged at call time.
at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(dst.dim() >= src.dim() && at::is_expandable_to(src.sizes(), dst.sizes()),
      "copy_: source of shape ", src.sizes(), " on ", src.device(),
      " cannot be broadcast to destination of shape ", dst.sizes(), " on ", dst.device());
  if (dst.numel() == 0) {
    return dst;
  }
  const bool src_npu = src.device().type() == kNpu;
  const bool dst_npu = dst.device().type() == kNpu;
  TORCH_CHECK((src_npu || src.is_cpu()) && (dst_npu || dst.is_cpu()),
      "copy_: npusim copies between npu and cpu only, got ", src.device(), " -> ", dst.device());
  const size_t nbytes = nbytes_contiguous(dst);
  at::Tensor dst_alias = cpu_alias(dst);
  at::Tensor src_alias = cpu_alias(src);

  if (src_npu && dst_npu) {
    NpuStream& src_stream = current_stream(src.device().index());
    if (src.device() == dst.device()) {
      // The checks copy_ makes through TensorIterator on CPU and CUDA, which
      // the _copy_from redirect skips.
      if (dst.is_alias_of(src) && dst.storage_offset() == src.storage_offset() &&
          dst.sizes().equals(src.sizes()) && dst.strides().equals(src.strides()) &&
          dst.scalar_type() == src.scalar_type() && dst.is_conj() == src.is_conj() &&
          dst.is_neg() == src.is_neg()) {
        return dst;  // the same data: nothing to copy
      }
      at::assert_no_internal_overlap(dst);
      at::assert_no_partial_overlap(dst, src);
      src_stream.enqueue([dst_alias, src_alias] { host_copy(dst_alias, src_alias); },
          copy_task_us(nbytes));
      return dst;
    }
    // Cross-device: a two-way barrier so that no one touches dst during the
    // copy and dst's stream sees the result (CUDA's copy_device_to_device).
    NpuStream& dst_stream = current_stream(dst.device().index());
    stream_wait_stream(src_stream, dst_stream);
    src_stream.enqueue([dst_alias, src_alias] { host_copy(dst_alias, src_alias); },
        link_task_us(nbytes));
    stream_wait_stream(dst_stream, src_stream);
    return dst;
  }

  if (dst_npu) {  // host -> device
    NpuStream& stream = current_stream(dst.device().index());
    if (non_blocking && !is_pinned_ptr(src.storage().data())) {
      // Stage a pageable source now: the caller may overwrite it right after.
      c10::Storage pinned(c10::Storage::use_byte_size_t(), nbytes_contiguous(src),
          pinned_allocator(), /*resizable=*/false);
      at::Tensor staging = at::empty({0}, src_alias.options())
                               .set_(pinned, 0, src.sizes(), c10::contiguous_strides(src.sizes()));
      host_copy(staging, src_alias);
      src_alias = staging;
    }
    stream.enqueue([dst_alias, src_alias] { host_copy(dst_alias, src_alias); }, copy_task_us(nbytes));
    if (!non_blocking) {
      stream.synchronize();
    }
    return dst;
  }

  // device -> host
  NpuStream& stream = current_stream(src.device().index());
  stream.enqueue([dst_alias, src_alias] { host_copy(dst_alias, src_alias); }, copy_task_us(nbytes));
  // A pageable destination is written synchronously, as the driver does: its
  // memory is not ours to keep alive until the copy runs.
  if (!non_blocking || !is_pinned_ptr(dst.storage().data())) {
    stream.synchronize();
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& src, const at::Tensor& dst) {
  if (!dst.sizes().equals(src.sizes())) {
    const_cast<at::Tensor&>(dst).resize_(src.sizes());
  }
  return copy_from(src, dst, false);
}

// ---- the fallback ---------------------------------------------------------

// Runs an op that has no npu kernel with PyTorch's CPU kernel on CPU views of
// the device memory: after the current stream's earlier work, synchronously.
class FallbackCall {
 public:
  explicit FallbackCall(const c10::OperatorHandle& op) : op_(op) {}

  c10::IValue to_cpu(const c10::IValue& v) {
    if (v.isTensor()) {
      return alias(v.toTensor());
    }
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) {
        out.push_back(alias(t));
      }
      return out;
    }
    if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> out;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        out.push_back(t.has_value() ? std::optional<at::Tensor>(alias(*t)) : std::nullopt);
      }
      return out;
    }
    if (v.isDevice() && v.toDevice().type() == kNpu) {
      note_device(v.toDevice().index() < 0 ? current_device() : v.toDevice().index());
      return c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
    return v;
  }

  c10::DeviceIndex device() const {
    return device_ < 0 ? current_device() : device_;
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
    for (auto& [device_impl, entry] : storages_) {
      c10::StorageImpl* cpu = entry.cpu.unsafeGetStorageImpl();
      if (cpu->data() == entry.original_data && cpu->nbytes() == device_impl->nbytes()) {
        continue;
      }
      const size_t nbytes = cpu->nbytes();
      c10::DataPtr moved = cpu->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
      device_impl->set_data_ptr_noswap(adopt_as_device(std::move(moved), nbytes, device()));
      device_impl->set_nbytes(nbytes);
    }
    for (auto& [device_tensor, cpu_tensor] : tensors_) {
      if (!device_tensor.sizes().equals(cpu_tensor.sizes()) ||
          !device_tensor.strides().equals(cpu_tensor.strides()) ||
          device_tensor.storage_offset() != cpu_tensor.storage_offset()) {
        device_tensor.unsafeGetTensorImpl()->set_sizes_and_strides(
            cpu_tensor.sizes(), cpu_tensor.strides(), cpu_tensor.storage_offset());
      }
    }
  }

 private:
  struct StorageEntry {
    c10::Storage cpu;
    const void* original_data;
    c10::Storage device;
  };

  void note_device(c10::DeviceIndex index) {
    if (device_ < 0) {
      device_ = index;
      return;
    }
    TORCH_CHECK(device_ == index,
        "Expected all tensors to be on the same device, but found at least two devices, npu:",
        static_cast<int>(device_), " and npu:", static_cast<int>(index), "! (when running ",
        op_.schema().operator_name(), ")");
  }

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNpu) {
      return t;
    }
    note_device(t.device().index());
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      c10::Storage cpu = cpu_storage_over(t.storage());
      it = storages_.emplace(key, StorageEntry{cpu, cpu.data(), t.storage()}).first;
    }
    at::Tensor cpu_tensor = cpu_alias_over(t, it->second.cpu);
    tensors_.emplace_back(t, cpu_tensor);
    return cpu_tensor;
  }

  at::Tensor back(const at::Tensor& t) {
    if (!t.defined() || !t.is_cpu()) {
      return t;
    }
    for (auto& [device_tensor, cpu_tensor] : tensors_) {
      if (cpu_tensor.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        return device_tensor;  // in-place and out= ops return their argument
      }
    }
    c10::StorageImpl* cpu_storage = t.storage().unsafeGetStorageImpl();
    c10::Storage device_storage;
    for (auto& [device_impl, entry] : storages_) {
      if (entry.cpu.unsafeGetStorageImpl() == cpu_storage) {
        device_storage = entry.device;  // a view of an input
      }
    }
    if (!device_storage) {
      auto fresh = fresh_.find(cpu_storage);
      if (fresh == fresh_.end()) {
        const size_t nbytes = cpu_storage->nbytes();
        c10::DataPtr moved =
            cpu_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
        c10::Storage adopted(c10::Storage::use_byte_size_t(), nbytes,
            adopt_as_device(std::move(moved), nbytes, device()), device_allocator(),
            /*resizable=*/true);
        fresh = fresh_.emplace(cpu_storage, adopted).first;
      }
      device_storage = fresh->second;
    }
    auto out = at::detail::make_tensor<c10::TensorImpl>(
        std::move(device_storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), t.dtype());
    out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    if (t.is_conj()) {
      out._set_conj(true);
    }
    if (t.is_neg()) {
      out._set_neg(true);
    }
    return out;
  }

  const c10::OperatorHandle& op_;
  c10::DeviceIndex device_ = -1;
  std::unordered_map<c10::StorageImpl*, StorageEntry> storages_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> fresh_;
  std::vector<std::pair<at::Tensor, at::Tensor>> tensors_;
};

bool is_optional_generator(const c10::Argument& arg) {
  auto opt = arg.type()->cast<c10::OptionalType>();
  return opt && opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t first = stack->size() - num_args;
  FallbackCall call(op);
  for (size_t i = 0; i < num_args; ++i) {
    (*stack)[first + i] = call.to_cpu((*stack)[first + i]);
  }
  const c10::DeviceIndex device = call.device();
  for (size_t i = 0; i < num_args; ++i) {
    if ((*stack)[first + i].isNone() && is_optional_generator(schema.arguments()[i])) {
      (*stack)[first + i] = c10::IValue(device_generator(device));
    }
  }
  wait_current_stream_idle(device);
  const c10::DeviceGuard guard(c10::Device(kNpu, device));
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  call.propagate_resizes();
  const size_t num_returns = schema.returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    (*stack)[i] = call.from_cpu((*stack)[i]);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  // Without these the PrivateUse1 slot gets a composite kernel instead of
  // CPU's own: native_layer_norm's math version runs batch_norm (slower), and
  // mse_loss's structured composite resizes a 0-dim output (a UserWarning).
  m.impl("native_layer_norm", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}

}  // namespace npusim
