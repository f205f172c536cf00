// CPU's TensorIterator kernels run by the host directly on npu tensors: see
// iterator_kernels.h and Note [TensorIterator kernels on npu tensors].
#include "iterator_kernels.h"

#include "intraop_threads.h"
#include "../runtime/device.h"
#include "../runtime/npu_type.h"
#include "../runtime/device_allocator.h"
#include "../runtime/subnormals.h"

#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/sub_native.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>
#include <utility>

namespace npusim {

// Note [TensorIterator kernels on npu tensors]
// The fallback runs an op on the host by making CPU aliases of its npu
// tensors, calling the CPU kernel through the dispatcher and turning its
// result back into an npu tensor (Note [Cost of the fallback]). For a.add(b)
// on 64 floats those steps were most of what npu cost over CPU. The
// elementwise binary ops need none of them. A TensorIterator takes npu
// tensors (npu memory is host memory); the op's meta function
// (at::meta::structured_add_Tensor::meta, ...) computes broadcasting, type
// promotion, the overlap checks and the output's strides for them as it
// does for CPU tensors; and CPU's kernel reads only the operands' pointers
// and strides. So the host builds the iterator of CPU's own structured
// kernel class (at::native::structured_ufunc_add_CPU, ...) on the npu
// tensors, allocates the output with the npu caching allocator where CPU's
// generated wrapper uses the CPU allocator, and calls the class's impl.
// Two things belong to a CPU iterator, and are bridged here:
//  - impl calls its DispatchStub with the iterator's device. Once meta is
//    done the iterator's record of its operands' device says CPU (the
//    tensors themselves are untouched), so the stub picks CPU's kernel.
//  - A CPU iterator casts operands of another dtype into temporaries of the
//    common dtype; a non-CPU one does not (CUDA's kernels cast as they
//    load). So only calls whose operands all have the common dtype run here.
//    A CPU scalar (a Python number) is cast to it first, as CPU's iterator
//    would cast it, where that gives CPU's values (operand_like_self). The
//    others (an integer tensor divided, two dtypes) take the fallback, which
//    runs CPU's iterator over CPU aliases.
// The rest of the fallback's host path holds here too: the op runs only when
// compute_on_the_host_now allows it (an idle stream; no capture, profiler
// or timing model), with its npu current and the user's intra-op threads,
// and its output comes from the same allocator on the same device. Errors
// are the meta function's, as for CPU tensors; an error leaves the
// destination of an in-place op untouched (meta runs before the kernel).

namespace {

std::atomic<int64_t> g_iterator_kernel_runs{0};

at::Tensor empty_on_current_npu(c10::IntArrayRef sizes, c10::IntArrayRef strides, const c10::TensorOptions& options) {
  const c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  const c10::ScalarType dtype = options.dtype().toScalarType();
  if (strides.empty()) {
    return at::detail::empty_generic(sizes, device_allocator(), keys, dtype, options.memory_format_opt());
  }
  return at::detail::empty_strided_generic(sizes, strides, device_allocator(), keys, dtype);
}

// CPU's structured kernel class `Structured` over npu tensors: a functional
// call's output from the npu allocator, an in-place call's its first argument.
template <class Structured>
class IteratorOnNpu final : public Structured {
 public:
  explicit IteratorOnNpu(const at::Tensor* self) : self_(self) {}

  void set_output_raw_strided(int64_t output_idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
      c10::TensorOptions options) override {
    if (self_ == nullptr) {
      out_ = empty_on_current_npu(sizes, strides, options);
    }
    // After the output exists: the base reads it through maybe_get_output.
    Structured::set_output_raw_strided(output_idx, sizes, strides, options);
  }

  const at::Tensor& maybe_get_output(int64_t /*output_idx*/) override {
    return self_ != nullptr ? *self_ : out_;
  }

  // Whether every operand has the common dtype (no cast for CPU's kernel to miss).
  bool needs_no_cast() const {
    for (int64_t i = 0; i < this->ntensors(); ++i) {
      if (this->dtype(i) != this->common_dtype()) {
        return false;
      }
    }
    return true;
  }

  // Makes impl's DispatchStub take CPU's kernel for these operands.
  void dispatch_as_cpu() {
    const c10::Device cpu(c10::DeviceType::CPU);
    for (at::OperandInfo& operand : this->operands_) {
      operand.device = cpu;
    }
    this->common_device_ = cpu;
  }

  at::Tensor take_output() {
    return std::move(out_);
  }

 private:
  const at::Tensor* self_;
  at::Tensor out_;
};

// `other` as CPU's iterator would read it, when this path serves the call
// (undefined otherwise): an npu tensor of self's device and dtype as it is;
// a CPU scalar (a Python number, a 0-dim CPU tensor) cast to self's dtype
// where the op's result has that dtype, as CPU's iterator casts it. Not for
// fp16 and bf16: their CPU kernels read a scalar from the uncast original in
// float (TensorIteratorBase::original_scalar_value), which the cast would
// round first.
c10::MaybeOwned<at::Tensor> operand_like_self(const at::Tensor& self, const at::Tensor& other) {
  const auto none = c10::MaybeOwned<at::Tensor>::owned(std::in_place);
  if (!self.defined() || !other.defined() || self.device().type() != kNpu || self.is_conj() || self.is_neg() ||
      other.is_conj() || other.is_neg()) {
    return none;
  }
  if (other.device() == self.device()) {
    return other.scalar_type() == self.scalar_type() ? c10::MaybeOwned<at::Tensor>::borrowed(other) : none;
  }
  if (!other.is_cpu() || other.dim() != 0 || c10::isReducedFloatingType(self.scalar_type()) ||
      at::result_type(self, other) != self.scalar_type()) {
    return none;
  }
  if (other.scalar_type() == self.scalar_type()) {
    return c10::MaybeOwned<at::Tensor>::borrowed(other);
  }
  return c10::MaybeOwned<at::Tensor>::owned(other.to(self.scalar_type()));
}

// Runs meta, then CPU's kernel; false, before the kernel, when a cast would be needed.
template <class Structured, class... Rest>
bool run_on_npu(const at::Tensor* in_place, at::Tensor* result, const at::Tensor& self, const at::Tensor& given,
    const Rest&... rest) {
  const c10::MaybeOwned<at::Tensor> other_ref = operand_like_self(self, given);
  const at::Tensor& other = *other_ref;
  if (!other.defined()) {
    return false;
  }
  follow_user_intraop_threads();  // Note [Intra-op threads of autograd's npu thread]
  const c10::OptionalDeviceGuard guard(npu_unless_current(self.device().index()));
  IteratorOnNpu<Structured> op(in_place);
  op.meta(self, other, rest...);
  if (!op.needs_no_cast()) {
    return false;
  }
  op.dispatch_as_cpu();
  {
    const KeepSubnormals keep_subnormals;  // Note [Subnormals on npu]
    op.impl(self, other, rest..., op.maybe_get_output(0));
  }
  if (in_place == nullptr) {
    *result = op.take_output();
  }
  g_iterator_kernel_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

int64_t iterator_kernel_runs() {
  return g_iterator_kernel_runs.load(std::memory_order_relaxed);
}

using at::native::structured_div_out;
using at::native::structured_mul_out;
using at::native::structured_sub_out;
using at::native::structured_ufunc_add_CPU;

bool IteratorKernel<at::_ops::add_Tensor>::run(at::Tensor* result, const at::Tensor& self, const at::Tensor& other,
    const c10::Scalar& alpha) {
  return run_on_npu<structured_ufunc_add_CPU>(nullptr, result, self, other, alpha);
}
bool IteratorKernel<at::_ops::add__Tensor>::run(at::Tensor*, at::Tensor& self, const at::Tensor& other,
    const c10::Scalar& alpha) {
  return run_on_npu<structured_ufunc_add_CPU>(&self, nullptr, self, other, alpha);
}
bool IteratorKernel<at::_ops::sub_Tensor>::run(at::Tensor* result, const at::Tensor& self, const at::Tensor& other,
    const c10::Scalar& alpha) {
  return run_on_npu<structured_sub_out>(nullptr, result, self, other, alpha);
}
bool IteratorKernel<at::_ops::sub__Tensor>::run(at::Tensor*, at::Tensor& self, const at::Tensor& other,
    const c10::Scalar& alpha) {
  return run_on_npu<structured_sub_out>(&self, nullptr, self, other, alpha);
}
bool IteratorKernel<at::_ops::mul_Tensor>::run(at::Tensor* result, const at::Tensor& self, const at::Tensor& other) {
  return run_on_npu<structured_mul_out>(nullptr, result, self, other);
}
bool IteratorKernel<at::_ops::mul__Tensor>::run(at::Tensor*, at::Tensor& self, const at::Tensor& other) {
  return run_on_npu<structured_mul_out>(&self, nullptr, self, other);
}
bool IteratorKernel<at::_ops::div_Tensor>::run(at::Tensor* result, const at::Tensor& self, const at::Tensor& other) {
  return run_on_npu<structured_div_out>(nullptr, result, self, other);
}
bool IteratorKernel<at::_ops::div__Tensor>::run(at::Tensor*, at::Tensor& self, const at::Tensor& other) {
  return run_on_npu<structured_div_out>(&self, nullptr, self, other);
}

}  // namespace npusim
