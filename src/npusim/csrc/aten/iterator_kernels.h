// CPU's TensorIterator kernels run by the host directly on npu tensors
// (iterator_kernels.cpp): the host path of the hottest binary ops without
// CPU aliases. See Note [TensorIterator kernels on npu tensors].
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/sub_ops.h>
#include <c10/core/Scalar.h>

#include <cstdint>
#include <type_traits>

namespace npusim {

// IteratorKernel<Op>::run(result, args...) runs Op on the host over its npu
// tensors as CPU's own kernel would, with the op's npu current: the caller
// has decided the op runs on the host now (compute_on_the_host_now). A
// functional op's output goes to *result (an in-place op writes its first
// argument and ignores `result`). It returns false, having allocated
// nothing that outlives the call and written nothing, when the arguments
// are not the plain case it serves (an npu `self` and an `other` of its
// device and dtype, or a CPU scalar of the result's dtype; no conjugate or
// negative bit; an iterator that needs no cast); the caller then takes the
// fallback. Errors are the op's meta function's and raise as they would on
// CPU.
template <class Op>
struct IteratorKernel : std::false_type {};

#define NPUSIM_ITERATOR_KERNEL(OP, ...)                   \
  template <>                                             \
  struct IteratorKernel<at::_ops::OP> : std::true_type {  \
    static bool run(at::Tensor* result, __VA_ARGS__);     \
  };

NPUSIM_ITERATOR_KERNEL(add_Tensor, const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha)
NPUSIM_ITERATOR_KERNEL(add__Tensor, at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha)
NPUSIM_ITERATOR_KERNEL(sub_Tensor, const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha)
NPUSIM_ITERATOR_KERNEL(sub__Tensor, at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha)
NPUSIM_ITERATOR_KERNEL(mul_Tensor, const at::Tensor& self, const at::Tensor& other)
NPUSIM_ITERATOR_KERNEL(mul__Tensor, at::Tensor& self, const at::Tensor& other)
NPUSIM_ITERATOR_KERNEL(div_Tensor, const at::Tensor& self, const at::Tensor& other)
NPUSIM_ITERATOR_KERNEL(div__Tensor, at::Tensor& self, const at::Tensor& other)

#undef NPUSIM_ITERATOR_KERNEL

// How many calls an IteratorKernel has run since the process started (for
// tests: which path the host took).
int64_t iterator_kernel_runs();

}  // namespace npusim
