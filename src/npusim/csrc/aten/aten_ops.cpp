// Base aten registrations for the npu device: factories, views, resize, set_,
// copies and scalar reads. Every other op runs through the fallback
// (fallback.cpp).
#include "device_hooks.h"
#include "../runtime/device_allocator.h"
#include "../runtime/event.h"
#include "../runtime/plan_mode.h"
#include "../runtime/stream.h"
#include "../runtime/subnormals.h"
#include "../runtime/timing.h"
#include "host_transfer.h"

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

namespace npusim {
namespace {

c10::DeviceIndex device_of(std::optional<c10::Device> device) {
  if (!device.has_value() || device->index() == -1) {
    return current_device();
  }
  check_device_index(device->index(), "npu tensor factory");
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
  // Growing keeps the old bytes: they are copied in stream order, after the
  // queued work that may still write them (resize_storage_bytes), so that
  // at::native::resize_ finds the storage big enough and copies nothing.
  const size_t needed = at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(),
      static_cast<size_t>(self.storage_offset()));
  if (self.storage() && self.storage().resizable() && needed > self.storage().nbytes()) {
    resize_storage_bytes(self.storage(), needed);
  }
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

// `a.set_(b)`: a shares b's storage, offset, sizes and strides (FSDP1's
// flat-parameter views rely on it).
at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  TORCH_CHECK(self.dtype() == source.dtype(), "set_: could not set an npu tensor of type ",
      self.dtype(), " to a tensor of type ", source.dtype());
  TORCH_CHECK(source.device() == self.device(), "set_: attempted to set the storage of a tensor on ",
      self.device(), " to the storage of a tensor on ", source.device());
  if (self.is_same(source)) {
    return self;
  }
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
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

namespace {

// At most this many bytes are copied by the caller when the stream is idle
// (Note [Work on an idle stream]): a few microseconds of host time, less than
// a worker wake-up. Larger copies stay stream tasks, which overlap with the
// host's next work.
constexpr size_t kHostCopyMaxBytes = 64 * 1024;

bool copy_on_the_host_now(const NpuStream& stream, size_t nbytes) {
  return nbytes <= kHostCopyMaxBytes && copy_task_us(nbytes) == 0.0 && done_on_the_host_now(stream);
}

// The copy a task would have made, made now by the caller; a failure names the
// op and the stream as the task's would, but raises at the call.
void copy_now(const NpuStream& stream, const char* op, const at::Tensor& dst, const at::Tensor& src) {
  const KeepSubnormals keep_subnormals;  // a converting copy is a device kernel: Note [Subnormals on npu]
  try {
    host_copy(dst, src);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "npusim: ", op, " on ", stream.name(), " failed: ", e.what_without_backtrace());
  }
}

}  // namespace

// Copies between npu and host or between npu devices, with the semantics of
// docs/SPEC.md section 3 (CUDA's Copy.cu): device copies are enqueued on the
// current stream; host<->device honours non_blocking (host_transfer.h says
// when the host waits and how pageable sources are kept). A small copy on an
// idle stream is done in place by the caller (Note [Work on an idle stream]).
at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(dst.dim() >= src.dim() && at::is_expandable_to(src.sizes(), dst.sizes()),
      "copy_: source of shape ", src.sizes(), " on ", src.device(),
      " cannot be broadcast to destination of shape ", dst.sizes(), " on ", dst.device());
  if (dst.numel() == 0) {
    return dst;
  }
  if (dst.is_alias_of(src) && dst.storage_offset() == src.storage_offset() &&
      dst.sizes().equals(src.sizes()) && dst.strides().equals(src.strides()) &&
      dst.scalar_type() == src.scalar_type() && dst.is_conj() == src.is_conj() &&
      dst.is_neg() == src.is_neg()) {
    // The same data (a copy onto itself, e.g. of one stride-0 view): nothing
    // to copy. Before the overlap check, as in copy_impl on CPU and CUDA,
    // which exit here before their TensorIterator rejects an overlapping
    // destination.
    return dst;
  }
  // Every direction, at call time, with CPU's message (a failure inside the
  // queued copy would only surface at the next synchronize).
  at::assert_no_internal_overlap(dst);
  const bool src_npu = src.device().type() == kNpu;
  const bool dst_npu = dst.device().type() == kNpu;
  TORCH_CHECK((src_npu || src.is_cpu()) && (dst_npu || dst.is_cpu()),
      "copy_: npusim copies between npu and cpu only, got ", src.device(), " -> ", dst.device());
  const size_t nbytes = byte_size(dst);
  at::Tensor dst_alias = cpu_alias(dst);
  // Note [Plan mode]: a large copy into npu memory writes nothing; it keeps its place on the stream and its time.
  const bool writes = !dst_npu || work_runs(nbytes);
  const auto copy_task = [writes](at::Tensor to, at::Tensor from) {
    return [writes, to = std::move(to), from = std::move(from)] {
      if (writes) {
        host_copy(to, from);
      }
    };
  };

  if (src_npu && dst_npu) {
    at::Tensor src_alias = cpu_alias(src);
    NpuStream& src_stream = current_stream(src.device().index());
    if (src.device() == dst.device()) {
      // The check copy_ makes through TensorIterator on CPU and CUDA, which
      // the _copy_from redirect skips.
      at::assert_no_partial_overlap(dst, src);
      if (copy_on_the_host_now(src_stream, nbytes)) {
        if (writes) {
          copy_now(src_stream, "copy_d2d", dst_alias, src_alias);
        }
        return dst;
      }
      TaskAccess access;  // a capture's only (Note [Replaying independent tasks at once])
      TaskAccess* const recorded = src_stream.capture() != nullptr ? &access : nullptr;
      if (recorded != nullptr) {
        access.add(src.storage().data(), src.storage().nbytes(), /*write=*/false);
        access.add(dst.storage().data(), dst.storage().nbytes(), /*write=*/true);
      }
      src_stream.enqueue(copy_task(dst_alias, src_alias), copy_task_us(nbytes), "copy_d2d", TaskKind::kWork,
          recorded);
      return dst;
    }
    // Cross-device: a two-way barrier so that no one touches dst during the
    // copy and dst's stream sees the result (CUDA's copy_device_to_device).
    NpuStream& dst_stream = current_stream(dst.device().index());
    stream_wait_stream(src_stream, dst_stream);
    src_stream.enqueue(copy_task(dst_alias, src_alias), link_task_us(nbytes), "copy_peer");
    stream_wait_stream(dst_stream, src_stream);
    return dst;
  }

  // host <-> device, on the current stream of the npu side
  NpuStream& stream = current_stream((dst_npu ? dst : src).device().index());
  if (copy_on_the_host_now(stream, nbytes)) {
    // Done before the call returns: no staging needed.
    if (writes) {
      copy_now(stream, dst_npu ? "copy_h2d" : "copy_d2h", dst_alias, cpu_alias(src));
    }
    return dst;
  }
  const bool host_waits = host_must_wait(dst, non_blocking);
  if (host_waits && stream.capture() != nullptr) {
    // Refused before anything is captured, so the capture goes on without
    // it (Note [Capture-time refusals]).
    stream.capture()->refuse_host_wait(stream, dst_npu ? "copy_h2d" : "copy_d2h");
  }
  at::Tensor src_alias = dst_npu && non_blocking && writes ? stage_pageable_sources({src})[0] : cpu_alias(src);
  stream.enqueue(copy_task(dst_alias, src_alias), copy_task_us(nbytes), dst_npu ? "copy_h2d" : "copy_d2h");
  if (host_waits) {
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
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}

// As PyTorch does for copy_: the copies handle conj and neg views themselves
// (host_copy runs CPU's copy_, which honours both bits). Through the
// Conjugate / Negative fallbacks instead, the source would be materialised
// by a copy that comes back here (endless recursion), and the destination,
// not marked mutable in _copy_from's schema, materialised into a temporary
// that is written and dropped.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace npusim
