// Argument checks of CPU kernels, made at the npu launch: see host_checks.h.
//
// Note [Argument checks of CPU kernels]
// An npu op that becomes a stream task (a large op, any op behind queued
// work) is checked at launch by its Meta kernel, and its CPU kernel runs
// later on the stream worker. A check that only the CPU kernel makes then
// fails inside the task, and the device stays failed for the rest of the
// process (Note [Errors of asynchronous work]), for a call whose only fault
// is an argument. CUDA makes these checks on the host before it launches
// (the same TORCH_CHECKs sit in the host code of its kernels), so the error
// raises from the call. Running each of PyTorch's OpInfo error inputs on npu
// behind a busy stream (every op a task) found eleven aten ops whose CPU
// kernels refuse what their Meta kernels let through, the device failing on
// 21 inputs, and one, index_select.out, that computed into an output whose
// elements overlap, where CPU refuses. The checks below are those CPU
// kernels' own, in their order and with their messages, so that the call
// raises what CPU (and CUDA) raise and the device stays usable. Where PyTorch
// exports the check (get_gelutype_enum, the overlap asserts,
// zero_numel_check_dims) it is called; the others repeat PyTorch 2.13's
// TORCH_CHECKs. They look at the arguments' metadata and values only, never
// at device data, so they cost the launch no wait. aminmax.out's is one case
// of a general rule, that a structured out= kernel takes outputs of its
// computed dtype only, which the launch now applies to every out= op (Note
// [out= tensors of another dtype]). logit_ of an integer self came from the
// in-place sweep of npusim.conformance.misuse. foreach sub's check, made here
// too, came first (a sub of bools). tests/test_host_checks.py runs the error
// inputs of these ops as tasks.
#include "host_checks.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/Gelu.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace npusim {
namespace {

// The argument named `name` of `op` on the stack.
const c10::IValue& arg(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first,
    const char* name) {
  const std::optional<int> index = op.schema().argumentIndexWithName(name);
  TORCH_INTERNAL_ASSERT(index.has_value(), op.schema().name(), " has no argument ", name);
  return stack[first + static_cast<size_t>(*index)];
}

// gelu's approximate argument (the unboxed gelu and gelu_backward check it
// in fallback_routes.cpp).
void check_gelu(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  at::native::get_gelutype_enum(arg(op, stack, first, "approximate").toStringRef());
}

// ConvParams' checks at the head of PyTorch's check_shape_forward
// (ATen/native/Convolution.cpp), which both CPU and CUDA run before any kernel.
void check_convolution(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const auto any = [&](const char* name, auto pred) {
    const c10::IValue& v = arg(op, stack, first, name);
    if (!v.isIntList()) {
      return false;  // symbolic sizes: a trace, not an npu launch
    }
    for (const int64_t x : v.toIntList()) {
      if (pred(x)) {
        return true;
      }
    }
    return false;
  };
  TORCH_CHECK(!any("padding", [](int64_t x) { return x < 0; }), "negative padding is not supported");
  TORCH_CHECK(!any("output_padding", [](int64_t x) { return x < 0; }), "negative output_padding is not supported");
  TORCH_CHECK(!any("stride", [](int64_t x) { return x <= 0; }), "non-positive stride is not supported");
  TORCH_CHECK(!any("dilation", [](int64_t x) { return x <= 0; }), "dilation should be greater than zero");
}

// kthvalue_out_impl_cpu's checks (ATen/native/Sorting.cpp).
void check_kthvalue(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const at::Tensor& self = arg(op, stack, first, "self").toTensor();
  const c10::IValue& k_value = arg(op, stack, first, "k");
  if (!k_value.isInt()) {
    return;
  }
  const int64_t k = k_value.toInt();
  const int64_t dim = at::maybe_wrap_dim(arg(op, stack, first, "dim").toInt(), self.dim(), /*wrap_scalar=*/true);
  const int64_t slicesize = self.dim() == 0 ? 1 : self.size(dim);
  at::native::zero_numel_check_dims(self, dim, "kthvalue()");
  TORCH_CHECK(k >= 1 && k <= slicesize, "kthvalue(): selected number k out of range for dimension ", dim);
  if (op.schema().overload_name() == "values") {
    // Before the launch resizes the outputs: values over self would reshape self.
    at::assert_no_overlap(self, arg(op, stack, first, "values").toTensor());
  }
}

// multinomial_out's checks (ATen/native/Distributions.cpp); the functional
// op's result is a Long tensor it allocates itself.
void check_multinomial(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const at::Tensor& self = arg(op, stack, first, "self").toTensor();
  const c10::IValue& num_samples = arg(op, stack, first, "num_samples");
  if (!num_samples.isInt()) {
    return;  // a symbolic count: a trace, not an npu launch
  }
  const int64_t n_sample = num_samples.toInt();
  const bool with_replacement = arg(op, stack, first, "replacement").toBool();
  TORCH_CHECK(self.dim() > 0 && self.dim() <= 2, "prob_dist must be 1 or 2 dim");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()),
      "multinomial only supports floating-point dtypes for input, got: ", self.scalar_type());
  if (op.schema().overload_name() == "out") {
    const at::ScalarType out = arg(op, stack, first, "out").toTensor().scalar_type();
    TORCH_CHECK(out == at::ScalarType::Long, "multinomial expects Long tensor out, got: ", out);
  }
  TORCH_CHECK(n_sample > 0, "cannot sample n_sample <= 0 samples");
  const int64_t n_categories = self.size(-1);
  TORCH_CHECK(with_replacement || (n_sample <= n_categories),
      "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  // As PyTorch: the sampled indices pass through float, exact to 2^24.
  constexpr int64_t kFloat32MaxConsecutiveInt = int64_t{1} << 24;
  TORCH_CHECK(n_categories <= kFloat32MaxConsecutiveInt, "number of categories cannot exceed 2^24");
}

// masked_fill's kernel converts the fill value to the tensor's dtype with
// Scalar::to, whose checked conversion refuses a value the dtype cannot
// hold ("value cannot be converted to type float without overflow").
void check_masked_fill_value(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const at::Tensor& self = arg(op, stack, first, "self").toTensor();
  const c10::IValue& value = arg(op, stack, first, "value");
  if (!value.isScalar()) {
    return;
  }
  const c10::Scalar scalar = value.toScalar();
  switch (self.scalar_type()) {
#define NPUSIM_CONVERT_TO(type, name) \
  case at::ScalarType::name:          \
    (void)scalar.to<type>();          \
    break;
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX(NPUSIM_CONVERT_TO)
#undef NPUSIM_CONVERT_TO
    default:
      break;  // the kernel's own dispatch decides
  }
}

// The overlap asserts of take_out and index_select_out_cpu_
// (ATen/native/TensorAdvancedIndexing.cpp): `out` has no element twice and
// shares no memory with `self` or `index`. A task cannot make them: its out=
// kernel sees the output as an alias of its own (TaskAliases::own), and
// index_select wrote an expanded output without complaint. (Either order of
// the two inputs raises the same message.)
void check_out_apart_from_inputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const at::Tensor& out = arg(op, stack, first, "out").toTensor();
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, arg(op, stack, first, "self").toTensor());
  at::assert_no_overlap(out, arg(op, stack, first, "index").toTensor());
}

// cat's overlap asserts for a given output (TORCH_PRECOMPUTE_META_FUNC(cat),
// whose Python stand-in on the Meta device leaves them out).
void check_cat_out(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const at::Tensor& out = arg(op, stack, first, "out").toTensor();
  const c10::List<at::Tensor> tensors = arg(op, stack, first, "tensors").toTensorList();
  if (tensors.empty()) {
    return;
  }
  at::assert_no_internal_overlap(out);
  for (const at::Tensor& t : tensors) {
    at::assert_no_overlap(out, t);
  }
}

// complex_check_dtype (ATen/native/TensorFactories.cpp), which complex.out runs.
void check_complex_out(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const at::ScalarType a = arg(op, stack, first, "real").toTensor().scalar_type();
  const at::ScalarType b = arg(op, stack, first, "imag").toTensor().scalar_type();
  const at::ScalarType out = arg(op, stack, first, "out").toTensor().scalar_type();
  const auto floating = [](at::ScalarType t) {
    return t == at::ScalarType::Float || t == at::ScalarType::Double || t == at::ScalarType::Half;
  };
  TORCH_CHECK(floating(a) && floating(b), "Expected both inputs to be Half, Float or Double tensors but got ", a,
      " and ", b);
  TORCH_CHECK(a == b, "Expected object of scalar type ", a, " but got scalar type ", b, " for second argument");
  TORCH_CHECK(out == c10::toComplexType(a), "Expected object of scalar type ", c10::toComplexType(a),
      " but got scalar type ", out, " for argument 'out'");
}

// aminmax.out's outputs take self's dtype exactly: its structured kernel's
// resize_out refuses any other (the Python Meta kernel copies into a dtype
// it can cast to). min is checked before max, as the kernel sets them.
void check_aminmax_out(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const caffe2::TypeMeta dtype = arg(op, stack, first, "self").toTensor().dtype();
  for (const char* name : {"min", "max"}) {
    const caffe2::TypeMeta out = arg(op, stack, first, name).toTensor().dtype();
    TORCH_CHECK(out == dtype, "Expected out tensor to have dtype ", dtype, ", but got ", out, " instead");
  }
}

// An in-place unary float op (logit_) on an integer or bool self: CPU's
// TensorIterator computes in the default float dtype and refuses to cast the
// result into self, where the op's Meta kernel lets it through.
void check_unary_float_in_place(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const at::ScalarType self = arg(op, stack, first, "self").toTensor().scalar_type();
  const at::ScalarType result = c10::typeMetaToScalarType(c10::get_default_dtype());
  TORCH_CHECK(!at::isIntegralType(self, /*includeBool=*/true) || c10::canCast(result, self), "result type ",
      result, " can't be cast to the desired output type ", self);
}

// torch.sub's refusal of bool operands, which CUDA's foreach sub kernels
// check on the host before they launch (sub_check on each pair, as the
// per-tensor sub does): the Meta kernels of the foreach ops do not, so as a
// task the CPU composite's refusal failed the device. Other foreach ops'
// arguments are checked by their Meta kernels at launch.
void check_foreach_sub(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  if (!stack[first].isTensorList()) {
    return;
  }
  const c10::List<at::Tensor> tensors = stack[first].toTensorList();
  const c10::IValue& other = stack[first + 1];  // a Tensor[], a Tensor, a Scalar or a Scalar[]
  if (other.isTensorList()) {
    const c10::List<at::Tensor> others = other.toTensorList();
    for (size_t i = 0; i < std::min(tensors.size(), others.size()); ++i) {
      at::native::sub_check(tensors[i], others[i]);
    }
  } else if (other.isTensor()) {
    for (const at::Tensor& self : tensors) {
      at::native::sub_check(self, other.toTensor());
    }
  } else if (other.isScalar()) {
    for (const at::Tensor& self : tensors) {
      at::native::sub_check(self, other.toScalar());
    }
  } else if (other.isList()) {
    const c10::List<c10::IValue> scalars = other.toList();
    for (size_t i = 0; i < std::min(tensors.size(), scalars.size()); ++i) {
      at::native::sub_check(tensors[i], scalars.get(i).toScalar());
    }
  }
}

// masked_scatter_'s mask dtype: its kernel takes bool masks only (a uint8
// mask, which CPU first warns is deprecated, is refused as well).
void check_masked_scatter(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const at::Tensor& mask = arg(op, stack, first, "mask").toTensor();
  TORCH_CHECK(mask.scalar_type() == at::ScalarType::Bool,
      "masked_scatter_ only supports boolean masks, but got mask with dtype ", mask.scalar_type());
  if (op.schema().name() == "aten::masked_scatter_") {
    // The in-place kernel expands the mask to self (expand_inplace), which refuses a mask of more dimensions
    // or of other sizes: the same expand of the mask's view, which touches no data.
    (void)mask.expand(arg(op, stack, first, "self").toTensor().sizes());
  }
}

// bucketize_out_cpu's check of the boundaries (ATen/native/Bucketization.cpp).
void check_bucketize(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const at::Tensor& boundaries = arg(op, stack, first, "boundaries").toTensor();
  TORCH_CHECK(boundaries.dim() == 1, "boundaries tensor must be 1 dimension, but got dim(", boundaries.dim(), ")");
}

}  // namespace

HostCheck host_check_of(std::string_view full_name) {
  static const std::unordered_map<std::string_view, HostCheck> checks = {
      {"aten::gelu_", check_gelu},
      {"aten::gelu.out", check_gelu},
      {"aten::gelu_backward.grad_input", check_gelu},
      {"aten::convolution", check_convolution},
      {"aten::kthvalue", check_kthvalue},
      {"aten::kthvalue.values", check_kthvalue},
      {"aten::multinomial", check_multinomial},
      {"aten::multinomial.out", check_multinomial},
      {"aten::masked_fill.Scalar", check_masked_fill_value},
      {"aten::masked_fill_.Scalar", check_masked_fill_value},
      {"aten::masked_fill.Scalar_out", check_masked_fill_value},
      {"aten::take.out", check_out_apart_from_inputs},
      {"aten::index_select.out", check_out_apart_from_inputs},
      {"aten::cat.out", check_cat_out},
      {"aten::complex.out", check_complex_out},
      {"aten::aminmax.out", check_aminmax_out},
      {"aten::logit_", check_unary_float_in_place},
      {"aten::masked_scatter_", check_masked_scatter},
      {"aten::masked_scatter", check_masked_scatter},
      {"aten::masked_scatter.out", check_masked_scatter},
      {"aten::bucketize.Tensor", check_bucketize},
      {"aten::bucketize.Tensor_out", check_bucketize},
      {"aten::bucketize.Scalar", check_bucketize},
      {"aten::bucketize.Scalar_out", check_bucketize},
  };
  // Every overload of _foreach_sub and _foreach_sub_ (List, Scalar, ScalarList and their outs).
  if (full_name.rfind("aten::_foreach_sub.", 0) == 0 || full_name.rfind("aten::_foreach_sub_.", 0) == 0) {
    return check_foreach_sub;
  }
  const auto it = checks.find(full_name);
  return it == checks.end() ? nullptr : it->second;
}

}  // namespace npusim
