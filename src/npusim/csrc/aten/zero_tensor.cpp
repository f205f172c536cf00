// aten::_efficientzerotensor for the npu: the all-zero tensor without memory
// that autograd formulas return for gradients known to be zero (sgn, abs and
// others on real inputs). Found by the OpInfo sweep (npusim.conformance).
#include "../runtime/npu_type.h"
#include "../runtime/stream.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/TensorFactories.h>
#include <torch/library.h>

namespace npusim {
namespace {

// Without this kernel the fallback ran CPU's, whose result has no storage
// bytes and the ZeroTensor key; the fallback then wrapped it as a plain npu
// tensor over a null pointer, and reading it segfaulted. Like CUDA's kernel,
// this one makes a tensor of the device's own key plus ZeroTensor, so every op
// that reads it materializes zeros on the device (PyTorch's ZeroTensor fallback).
at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>) {
  const c10::DeviceIndex index =
      device.has_value() && device->index() >= 0 ? device->index() : current_device();
  at::native::ZeroTensorAllocator allocator(c10::Device(kNpu, index));
  const c10::DispatchKeySet keys =
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, &allocator, keys, c10::dtype_or_default(dtype), std::nullopt);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_efficientzerotensor", TORCH_FN(efficientzerotensor));
}

}  // namespace npusim
