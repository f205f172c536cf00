// A pointwise task's elements in parts that a waiting host can take: see
// Note [Pointwise work shared with a waiting host].
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace npusim {

// Note [Pointwise work shared with a waiting host]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The end of a training step is a row of pointwise tasks (AccumulateGrad's
// adds into .grad, an optimizer's updates) that the worker runs one by one
// while the host waits for them at a synchronize or an .item(): one core
// computes and the other spins. A pointwise kernel's every output element
// comes from the same elements of its inputs (Note [A core for the host]),
// so its elements can be split like the spans of a foreach copy (Note [A
// waiting host helps]):
// a task whose tensors are all one contiguous shape (a 0-dim operand is
// broadcast and kept whole) runs its kernel over parts of kPointwisePart
// elements, flat views of each tensor at the part's offset, through
// run_shared, and a host that waits for the stream takes parts too.
//
// The numbers are the unsplit kernel's, bit for bit: a part's offset is a
// multiple of kPointwisePart (16384), which every vectorized loop's step
// (2 x the vector width: 128 elements at most, int8 on AVX-512) divides, so
// each element meets the same vector or scalar code it meets in one call, and
// the last part ends in the unsplit call's tail. A part is below
// at::internal::GRAIN_SIZE, so no part starts an OpenMP region on either
// thread. The task splits only when host_may_help(): on a stream nobody waits
// for, parts would only add kernel calls. A step of 4 x Linear(1024, 1024)
// accumulating into .grad and updating with SGD(foreach=False) went from
// 6.27 to 5.32 ms with one intra-op thread, 4.28 to 4.07 ms with two
// (docs/BENCHMARKS.md).
//
// Only arithmetic kernels split (shares_pointwise_parts: the adds, products,
// quotients, comparisons and activation backwards of a training step's
// tail). Transcendental CPU kernels (tanh, exp, log, ...) call MKL's vector
// math, and two threads making their first call of one such function at
// once do not get one result: in 3 of 8 fresh processes whose first tanh
// ran as concurrent parts, one whole part came out hundreds of ulps off
// (up to 5e-5 near 0.8), as from a less accurate code path, and in none of
// 16 once the process had called tanh before. Pointwise is not enough for
// bit for bit there, so those kernels run whole.
constexpr int64_t kPointwisePart = 16384;

// Whether the unboxed op `name` ("aten::add_.Tensor") is an arithmetic
// pointwise kernel whose parts a waiting host may take.
inline bool shares_pointwise_parts(std::string_view name) {
  static constexpr std::array<std::string_view, 22> kArithmetic = {"aten::add.Tensor", "aten::add_.Tensor",
      "aten::sub.Tensor", "aten::sub_.Tensor", "aten::mul.Tensor", "aten::mul_.Tensor", "aten::div.Tensor",
      "aten::div_.Tensor", "aten::addcmul", "aten::addcmul_", "aten::addcdiv", "aten::addcdiv_", "aten::neg",
      "aten::maximum", "aten::clamp", "aten::eq.Tensor", "aten::eq.Scalar", "aten::ne.Scalar", "aten::gt.Scalar",
      "aten::lt.Scalar", "aten::threshold_backward", "aten::sigmoid_backward"};
  return std::find(kArithmetic.begin(), kArithmetic.end(), name) != kArithmetic.end();
}

// The parts `tensors` (the kernel's tensor arguments and output; null or
// undefined ones are skipped) split into: 1 (run whole) unless every defined
// tensor of more than 0 dimensions has one shape of at least two parts,
// is contiguous and has no lazy conjugate or negative bit.
inline int64_t pointwise_parts(c10::ArrayRef<const at::Tensor*> tensors) {
  const at::Tensor* shape = nullptr;
  for (const at::Tensor* t : tensors) {
    if (t == nullptr || !t->defined() || t->dim() == 0) {
      continue;
    }
    if (shape == nullptr) {
      shape = t;
      if (t->numel() < 2 * kPointwisePart) {
        return 1;
      }
    } else if (!t->sizes().equals(shape->sizes())) {
      return 1;
    }
    if (!t->is_contiguous() || t->is_conj() || t->is_neg()) {
      return 1;
    }
  }
  return shape == nullptr ? 1 : (shape->numel() + kPointwisePart - 1) / kPointwisePart;
}

// Part `part` of `t` as a flat view (a new TensorImpl over t's storage, made
// without the dispatcher: a helping host must not meet its own Python modes);
// a 0-dim or undefined tensor as it is.
inline at::Tensor pointwise_part(const at::Tensor& t, int64_t part) {
  if (!t.defined() || t.dim() == 0) {
    return t;
  }
  const int64_t begin = part * kPointwisePart;
  const int64_t length = std::min(kPointwisePart, t.numel() - begin);
  auto view = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  view.unsafeGetTensorImpl()->set_sizes_contiguous({length});
  view.unsafeGetTensorImpl()->set_storage_offset(t.storage_offset() + begin);
  return view;
}

inline std::optional<at::Tensor> pointwise_part(const std::optional<at::Tensor>& t, int64_t part) {
  return t.has_value() ? std::optional<at::Tensor>(pointwise_part(*t, part)) : std::nullopt;
}

// Any other argument (a scalar, a dtype) as it is.
template <class T>
const T& pointwise_part(const T& value, int64_t) {
  return value;
}

}  // namespace npusim
