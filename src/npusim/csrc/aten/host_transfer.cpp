#include "host_transfer.h"

#include "../runtime/host_allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

namespace npusim {

size_t byte_size(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

size_t bytes_to_storage_end(const at::Tensor& t) {
  return t.storage().nbytes() - static_cast<size_t>(t.storage_offset()) * t.element_size();
}

bool same_byte_layout(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.is_conj() || src.is_conj() || dst.is_neg() || src.is_neg()) {
    return false;
  }
  if (dst.sizes().equals(src.sizes()) && dst.strides().equals(src.strides())) {
    // Dense tensors with equal sizes and strides occupy the same byte span
    // starting at their lowest element.
    return dst.is_non_overlapping_and_dense();
  }
  return dst.numel() == src.numel() && dst.is_contiguous() && src.is_contiguous();
}

bool same_byte_layouts(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs) {
  if (dsts.size() != srcs.size()) {
    return false;
  }
  for (size_t i = 0; i < dsts.size(); ++i) {
    if (!same_byte_layout(dsts[i], srcs[i])) {
      return false;
    }
  }
  return true;
}

at::Tensor tensor_over(c10::Storage storage, c10::DispatchKeySet keys, const at::Tensor& like) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) {
    out._set_conj(true);
  }
  if (like.is_neg()) {
    out._set_neg(true);
  }
  return out;
}

c10::Storage cpu_storage_over(const c10::Storage& device_storage) {
  c10::StorageImpl* impl = device_storage.unsafeGetStorageImpl();
  return c10::Storage(c10::Storage::use_byte_size_t(), impl->nbytes(),
      c10::DataPtr(impl->mutable_data(), c10::Device(c10::DeviceType::CPU)),
      c10::GetCPUAllocator(), /*resizable=*/true);
}

at::Tensor cpu_alias_over(const at::Tensor& t, const c10::Storage& cpu_storage) {
  at::Tensor alias = tensor_over(cpu_storage, c10::DispatchKeySet(c10::DispatchKey::CPU), t);
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    alias.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  return alias;
}

at::Tensor cpu_alias(const at::Tensor& t) {
  return cpu_alias_over(t, cpu_storage_over(t.storage()));
}

bool is_pageable(const at::Tensor& t) {
  return t.is_cpu() && !is_pinned_ptr(t.storage().data());
}

bool host_must_wait(const at::Tensor& dst, bool non_blocking) {
  return !non_blocking || is_pageable(dst);
}

std::vector<at::Tensor> stage_pageable_sources(const std::vector<at::Tensor>& srcs) {
  // Offsets are kept 64-byte aligned: every element size divides 64.
  constexpr size_t kAlign = 64;
  auto aligned = [](size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  size_t total = 0;
  for (const at::Tensor& s : srcs) {
    if (is_pageable(s)) {
      total += aligned(byte_size(s));
    }
  }
  std::vector<at::Tensor> out;
  out.reserve(srcs.size());
  if (total == 0) {
    for (const at::Tensor& s : srcs) {
      out.push_back(cpu_alias(s));
    }
    return out;
  }
  c10::Storage block(c10::Storage::use_byte_size_t(), total, pinned_allocator(), /*resizable=*/false);
  size_t offset = 0;
  for (const at::Tensor& s : srcs) {
    if (!is_pageable(s)) {
      out.push_back(cpu_alias(s));
      continue;
    }
    // A contiguous copy of the source's elements, taken now: the caller may
    // overwrite the source as soon as the call returns.
    at::Tensor staged = at::empty({0}, s.options().device(c10::kCPU))
                            .set_(block, static_cast<int64_t>(offset / s.element_size()), s.sizes(),
                                c10::contiguous_strides(s.sizes()));
    host_copy(staged, s);
    out.push_back(staged);
    offset += aligned(byte_size(s));
  }
  return out;
}

void host_copy(const at::Tensor& dst, const at::Tensor& src) {
  if (same_byte_layout(dst, src)) {
    const size_t nbytes = byte_size(dst);
    if (nbytes > 0 && dst.data_ptr() != src.data_ptr()) {
      std::memmove(dst.data_ptr(), src.data_ptr(), nbytes);
    }
    return;
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  const_cast<at::Tensor&>(dst).copy_(src);
}

}  // namespace npusim
