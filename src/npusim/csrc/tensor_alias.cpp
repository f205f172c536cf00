#include "tensor_alias.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

namespace npusim {

c10::Storage cpu_storage_over(const c10::Storage& device_storage) {
  c10::StorageImpl* impl = device_storage.unsafeGetStorageImpl();
  return c10::Storage(c10::Storage::use_byte_size_t(), impl->nbytes(),
      c10::DataPtr(impl->mutable_data(), c10::Device(c10::DeviceType::CPU)),
      c10::GetCPUAllocator(), /*resizable=*/true);
}

at::Tensor cpu_alias_over(const at::Tensor& t, const c10::Storage& cpu_storage) {
  auto alias = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) {
    alias._set_conj(true);
  }
  if (t.is_neg()) {
    alias._set_neg(true);
  }
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    alias.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  return alias;
}

at::Tensor cpu_alias(const at::Tensor& t) {
  return cpu_alias_over(t, cpu_storage_over(t.storage()));
}

void host_copy(const at::Tensor& dst, const at::Tensor& src) {
  const bool same_layout = dst.dtype() == src.dtype() && dst.sizes().equals(src.sizes()) &&
      dst.strides().equals(src.strides()) && !dst.is_conj() && !src.is_conj() &&
      !dst.is_neg() && !src.is_neg() && dst.is_non_overlapping_and_dense();
  if (same_layout) {
    // Dense tensors with equal sizes and strides occupy the same byte span
    // starting at their lowest element.
    const size_t nbytes = static_cast<size_t>(dst.numel()) * dst.element_size();
    if (nbytes > 0 && dst.data_ptr() != src.data_ptr()) {
      std::memmove(dst.data_ptr(), src.data_ptr(), nbytes);
    }
    return;
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  const_cast<at::Tensor&>(dst).copy_(src);
}

}  // namespace npusim
