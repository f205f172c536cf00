// Kernels where npu follows CUDA rather than the CPU kernel it runs on.
//
// Note [npu follows CUDA where CPU differs]
// npu models an accelerator, so where PyTorch's CPU and CUDA kernels accept
// different things, npu accepts what CUDA accepts. Every such case:
//  1. Device rules (fallback.cpp, Note [Device rules of the fallback]): a CPU
//     tensor in an npu op raises CUDA's "Expected all tensors to be on the
//     same device" unless it is a 0-dim scalar or an index; CPU kernels would
//     compute on it.
//  2. Mixed-dtype batch norm (this file): fp16/bf16 input with parameters
//     and running statistics of other dtypes (FSDP2 mixed precision keeps
//     fp32 buffers next to bf16 weights). CPU accepts only all-fp32
//     parameters; CUDA computes in fp32, as npu does here, except where
//     CUDA's fused backward kernel refuses the mix (Note [CUDA's fused batch
//     norm backward]).
//  3. Fused RNN cells (npusim/ops/rnn_cells.py): LSTM / GRU on a PrivateUse1
//     tensor call the fused cells CUDA has (_thnn_fused_lstm_cell,
//     _thnn_fused_gru_cell) and CPU lacks; npu implements them.
//  4. SyncBatchNorm statistics (npusim/ops/sync_batch_norm.py):
//     batch_norm_stats and the four ops after it exist for CUDA only.
//  5. Fork after use (runtime/device.cpp, Note [Fork after npu use]): the child
//     raises, as CUDA's does; CPU has no such state.
//  6. Dtypes CUDA's kernel takes and CPU's refuses (this file, Note [Dtypes
//     CUDA accepts and CPU refuses]): histc of integers, abs and trace of
//     bool, complex nansum, fp16 / bf16 pooling, losses and rrelu.
#include "fallback.h"

#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

namespace npusim {
namespace {

using OptTensor = std::optional<at::Tensor>;

// True when some defined tensor's dtype differs from `input`'s: CPU's
// kernels reject most such mixes, CUDA's compute them in fp32.
bool is_mixed(const at::Tensor& input, std::initializer_list<const OptTensor*> others) {
  for (const OptTensor* t : others) {
    if (t->has_value() && (*t)->defined() && (*t)->scalar_type() != input.scalar_type()) {
      return true;
    }
  }
  return false;
}

OptTensor to_float(const OptTensor& t) {
  if (!t.has_value() || !t->defined()) {
    return t;
  }
  return t->to(at::kFloat);  // a float tensor is returned as is: updated in place
}

// Runs aten::<name>.<overload> through the CPU fallback with these arguments.
std::vector<c10::IValue> run_fallback(const char* name, std::vector<c10::IValue> args, const char* overload = "") {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  torch::jit::Stack stack(std::move(args));
  npu_fallback(op, &stack);
  return stack;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(const at::Tensor& input,
    const OptTensor& weight, const OptTensor& bias, const OptTensor& running_mean,
    const OptTensor& running_var, bool training, double momentum, double eps) {
  const bool mixed = is_mixed(input, {&weight, &bias, &running_mean, &running_var});
  const OptTensor mean32 = mixed ? to_float(running_mean) : running_mean;
  const OptTensor var32 = mixed ? to_float(running_var) : running_var;
  auto out = run_fallback("aten::native_batch_norm",
      {mixed ? input.to(at::kFloat) : input, mixed ? to_float(weight) : weight,
       mixed ? to_float(bias) : bias, mean32, var32, training, momentum, eps});
  if (mixed && training) {
    // Running statistics of a reduced dtype were updated in an fp32 copy.
    for (auto [stat, stat32] : {std::pair{&running_mean, &mean32}, std::pair{&running_var, &var32}}) {
      if (stat->has_value() && (*stat)->defined() && !(*stat)->is_same(**stat32)) {
        (*stat)->copy_(**stat32);
      }
    }
  }
  at::Tensor output = out[0].toTensor();
  return {mixed ? output.to(input.scalar_type()) : output, out[1].toTensor(), out[2].toTensor()};
}

// Note [CUDA's fused batch norm backward]
// CUDA's native_batch_norm_backward (batch_norm_backward_cuda) takes a fused
// kernel when it needs the input's gradient and a reduction (training, or a
// weight / bias gradient), the input is not laid out for its channels-last
// kernels (channels_last, or contiguous with stride 1 in dim 1, as an (N, C)
// input is) and 32-bit indexing suffices. That kernel reads weight,
// running_mean and running_var as one statistics dtype: the input's, or the
// input's accumulation type when the first defined of the three has another
// dtype; any of them in a third dtype is CUDA's "Expected running_mean to
// have type BFloat16 but got Float". So bf16 weights with fp32 running
// statistics (FSDP2's param_dtype=bf16 on a BatchNorm2d) fail in backward on
// CUDA, for an (N, C, H, W) input, and compute for an (N, C) one; npu does
// the same (PyTorch's test_fully_shard_mixed_precision.py test_norm_modules
// expects both). The saved statistics are npu's own (CPU's forward kernel
// keeps them in the input's dtype where CUDA's are fp32) and not checked.
bool can_use_32bit_index_math(const at::Tensor& t) {
  constexpr int64_t limit = std::numeric_limits<int32_t>::max();
  if (t.numel() > limit) {
    return false;
  }
  int64_t offset = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    offset += (t.size(d) - 1) * t.stride(d);
  }
  return offset < limit;
}

void check_cuda_fused_backward_dtypes(const at::Tensor& grad_out, const at::Tensor& input,
    const OptTensor& weight, const OptTensor& running_mean, const OptTensor& running_var, bool train,
    std::array<bool, 3> output_mask) {
  const bool needs_reduction = train || output_mask[1] || output_mask[2];
  const bool channels_last_kernels = input.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      (input.is_contiguous() && input.dim() > 1 && input.stride(1) == 1);
  if (!needs_reduction || !output_mask[0] || channels_last_kernels || !can_use_32bit_index_math(input) ||
      !can_use_32bit_index_math(grad_out)) {
    return;
  }
  const std::pair<const char*, const OptTensor*> params[] = {
      {"weight", &weight}, {"running_mean", &running_mean}, {"running_var", &running_var}};
  c10::ScalarType stat = input.scalar_type();
  for (const auto& [name, t] : params) {
    if (t->has_value() && (*t)->defined()) {
      if ((*t)->scalar_type() != input.scalar_type()) {
        stat = at::toAccumulateType(input.scalar_type(), /*is_cuda=*/true);
      }
      break;
    }
  }
  TORCH_CHECK(grad_out.scalar_type() == input.scalar_type(), "Expected grad_output to have type ",
      input.scalar_type(), " but got ", grad_out.scalar_type());
  for (const auto& [name, t] : params) {
    TORCH_CHECK(!t->has_value() || !(*t)->defined() || (*t)->scalar_type() == stat, "Expected ", name,
        " to have type ", stat, " but got ", (*t)->scalar_type());
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(const at::Tensor& grad_out,
    const at::Tensor& input, const OptTensor& weight, const OptTensor& running_mean,
    const OptTensor& running_var, const OptTensor& save_mean, const OptTensor& save_invstd,
    bool train, double eps, std::array<bool, 3> output_mask) {
  check_cuda_fused_backward_dtypes(grad_out, input, weight, running_mean, running_var, train, output_mask);
  const OptTensor grad(grad_out);
  const bool mixed =
      is_mixed(input, {&grad, &weight, &running_mean, &running_var, &save_mean, &save_invstd});
  if (!mixed) {
    auto out = run_fallback("aten::native_batch_norm_backward", {grad_out, input, weight,
        running_mean, running_var, save_mean, save_invstd, train, eps,
        c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]})});
    return {out[0].toTensor(), out[1].toTensor(), out[2].toTensor()};
  }
  auto out = run_fallback("aten::native_batch_norm_backward", {grad_out.to(at::kFloat),
      input.to(at::kFloat), to_float(weight), to_float(running_mean), to_float(running_var),
      to_float(save_mean), to_float(save_invstd), train, eps,
      c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]})});
  const c10::ScalarType param_dtype =
      weight.has_value() && weight->defined() ? weight->scalar_type() : input.scalar_type();
  auto cast = [](const c10::IValue& v, c10::ScalarType dtype) {
    const at::Tensor t = v.toTensor();
    return t.defined() ? t.to(dtype) : t;
  };
  return {cast(out[0], input.scalar_type()), cast(out[1], param_dtype), cast(out[2], param_dtype)};
}

// Note [Dtypes CUDA accepts and CPU refuses]
// Found from OpInfo's per-device dtype lists (dtypesIfCUDA against dtypes,
// checked by tests/test_cuda_semantics.py). npu computes them as CUDA's
// kernels define them, with npu ops or CPU's kernels:
//  - histc of integers (torchtitan's MoE router counts expert indices so):
//    CUDA's _histc_cuda, bounds in int64 (the accumulation type), the data's
//    min and max when min == max, widened by one each way when equal, bin
//    (x - min) * bins / (max - min) in integer arithmetic with max in the
//    last bin, counts in the input's dtype;
//  - abs of bool: the identity (CUDA's abs kernel dispatches Bool);
//    nn.functional.softsign of bool follows from it;
//  - trace of bool: CUDA's trace_cuda, diagonal().sum() (int64);
//  - nansum of complex input (and so nanmean): CUDA's sum with every element
//    that has a NaN part counted as zero;
//  - fp16 / bf16 avg_pool3d, _upsample_bilinear2d_aa, _upsample_bicubic2d_aa,
//    multi_margin_loss, multilabel_margin_loss (forward and backward) and
//    fp16 rrelu: CUDA's kernels read the reduced values into fp32 (their
//    accumulation type), compute there and round the results once; npu runs
//    CPU's fp32 kernel on the widened values and rounds its results
//    (WIDENED_TO_FP32).
// Every other dtype runs CPU's kernel, also where CPU accepts more than CUDA
// (histc of fp16): a wider npu breaks no CUDA program. Not honoured, with
// why: complex32 (ComplexHalf, which PyTorch marks experimental) in about 25
// elementwise ops, sum, prod, trace and the fft family, and fp16 fft. CPU
// has no kernel for them and they are among the hottest ops (sum, div, exp):
// a dtype test in front of their CPU kernels would cost every call, and
// CUDA's fft in half runs cuFFT's half-precision transforms (power-of-two
// sizes only), which an fp32 transform rounded to half is not. They raise
// CPU's "not implemented for 'ComplexHalf'" / "Unsupported dtype Half", at
// the call (complex32 ops run on the host: Note [complex32 on the host]).
bool is_integral(const at::Tensor& t) {
  return at::isIntegralType(t.scalar_type(), /*includeBool=*/false);
}

at::Tensor histc_integral(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  TORCH_CHECK(bins > 0, "bins must be > 0");
  int64_t lo = min.toLong();
  int64_t hi = max.toLong();
  if (lo == hi && self.numel() > 0) {
    const auto [data_min, data_max] = at::aminmax(self);
    lo = data_min.item<int64_t>();
    hi = data_max.item<int64_t>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  TORCH_CHECK(lo < hi, "max must be larger than min");
  const at::Tensor x = self.reshape({-1}).to(at::kLong);
  const at::Tensor in_range = x.ge(lo).logical_and_(x.le(hi));
  const at::Tensor bin = x.sub(lo).mul_(bins).div_(hi - lo, "trunc").clamp_max_(bins - 1);
  // Values outside [min, max] go to a bin past the last, which is dropped.
  const at::Tensor index = at::where(in_range, bin, at::scalar_tensor(bins, x.options()));
  return at::bincount(index, {}, bins + 1).narrow(0, 0, bins).to(self.scalar_type());
}

// An out= variant's result: `out` resized (as CUDA's kernels do) and written.
at::Tensor& write_out(at::Tensor& out, const at::Tensor& result) {
  at::native::resize_output(out, result.sizes());
  out.copy_(result);
  return out;
}

at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  if (!is_integral(self)) {
    return run_fallback("aten::histc", {self, bins, min, max})[0].toTensor();
  }
  return histc_integral(self, bins, min, max);
}

at::Tensor& histc_out(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max,
    at::Tensor& out) {
  if (!is_integral(self)) {
    run_fallback("aten::histc", {self, bins, min, max, out}, "out");
    return out;
  }
  return write_out(out, histc_integral(self, bins, min, max));
}

at::Tensor& abs_out(const at::Tensor& self, at::Tensor& out) {
  if (self.scalar_type() != at::kBool) {
    run_fallback("aten::abs", {self, out}, "out");
    return out;
  }
  return write_out(out, self);
}

at::Tensor trace(const at::Tensor& self) {
  if (self.scalar_type() != at::kBool) {
    return run_fallback("aten::trace", {self})[0].toTensor();
  }
  TORCH_CHECK(self.dim() == 2, "expected a matrix");
  return self.diagonal().sum();
}

at::Tensor nansum_cuda(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
    std::optional<c10::ScalarType> dtype) {
  if (!self.is_complex()) {
    return run_fallback("aten::nansum", {self, dim, keepdim, dtype})[0].toTensor();
  }
  const at::Tensor zeroed = at::where(at::isnan(self), at::zeros({}, self.options()), self);
  return at::sum(zeroed, dim, keepdim, dtype);
}

at::Tensor& nansum_cuda_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
    std::optional<c10::ScalarType> dtype, at::Tensor& out) {
  if (!self.is_complex()) {
    run_fallback("aten::nansum", {self, dim, keepdim, dtype, out}, "out");
    return out;
  }
  return write_out(out, nansum_cuda(self, dim, keepdim, dtype));
}

// The ops whose fp16 / bf16 tensors npu widens to fp32 for CPU's kernel (Note
// [Dtypes CUDA accepts and CPU refuses]), every variant.
constexpr const char* WIDENED_TO_FP32[] = {
    "avg_pool3d", "avg_pool3d.out", "avg_pool3d_backward", "avg_pool3d_backward.grad_input",
    "_upsample_bilinear2d_aa", "_upsample_bilinear2d_aa.out", "_upsample_bilinear2d_aa_backward",
    "_upsample_bilinear2d_aa_backward.grad_input", "_upsample_bicubic2d_aa", "_upsample_bicubic2d_aa.out",
    "_upsample_bicubic2d_aa_backward", "_upsample_bicubic2d_aa_backward.grad_input", "multi_margin_loss",
    "multi_margin_loss.out",
    "multi_margin_loss_backward", "multi_margin_loss_backward.grad_input", "multilabel_margin_loss_forward",
    "multilabel_margin_loss_forward.output", "multilabel_margin_loss_backward",
    "multilabel_margin_loss_backward.grad_input", "rrelu_with_noise", "rrelu_with_noise.out",
    "rrelu_with_noise_", "rrelu_with_noise_backward"};

bool is_reduced_float(const c10::IValue& v) {
  if (!v.isTensor()) {
    return false;
  }
  const at::Tensor& t = v.toTensor();
  return t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
}

// CPU's kernel on fp32 copies of the op's fp16 / bf16 tensors, its results
// rounded back (written arguments are copied back into the caller's). The
// dtype is the inputs' (an out= tensor's is checked against it, as CUDA's
// structured kernels check it: widening an fp16 out= tensor of an fp32 input
// would have cast the result into it).
void widened_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  std::optional<c10::ScalarType> reduced;
  for (size_t i = 0; i < args.size() && !reduced; ++i) {
    if (!args[i].is_out() && is_reduced_float((*stack)[first + i])) {
      reduced = (*stack)[first + i].toTensor().scalar_type();
    }
  }
  if (!reduced) {
    npu_fallback(op, stack);  // an fp16 out= tensor of fp32 inputs: Note [out= tensors of another dtype]
    return;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (args[i].is_out() && v.isTensor() && v.toTensor().defined()) {
      TORCH_CHECK(v.toTensor().scalar_type() == *reduced, "Expected out tensor to have dtype ",
          c10::scalarTypeToTypeMeta(*reduced), ", but got ", v.toTensor().dtype(), " instead");
    }
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (the caller's tensor, its fp32 stand-in)
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (is_reduced_float(v)) {
      const at::Tensor original = v.toTensor();
      const at::Tensor wide = original.to(at::kFloat);
      if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) {
        written.emplace_back(original, wide);
      }
      v = wide;
    }
  }
  npu_fallback(op, stack);
  for (auto& [original, wide] : written) {
    at::native::resize_output(original, wide.sizes());
    original.copy_(wide);
  }
  const size_t num_returns = op.schema().returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    c10::IValue& r = (*stack)[i];
    if (!r.isTensor() || !r.toTensor().defined()) {
      continue;
    }
    const at::Tensor result = r.toTensor();
    const auto same =
        std::find_if(written.begin(), written.end(), [&](const auto& w) { return w.second.is_same(result); });
    if (same != written.end()) {
      r = same->first;
    } else if (result.scalar_type() == at::kFloat) {
      r = result.to(*reduced);
    }
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : WIDENED_TO_FP32) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&widened_fallback>());
  }
  m.impl("nansum", TORCH_FN(nansum_cuda));
  m.impl("nansum.out", TORCH_FN(nansum_cuda_out));
  m.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  m.impl("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward));
  m.impl("histc", TORCH_FN(histc));
  m.impl("histc.out", TORCH_FN(histc_out));
  m.impl("abs.out", TORCH_FN(abs_out));
  m.impl("trace", TORCH_FN(trace));
  // mode's out= variant is a composite that refuses every device but CPU, CUDA and XPU ("mode only supports
  // CPU, CUDA and XPU device type, got: npu"), while its functional form runs: on CUDA both run, so npu runs
  // it as the fallback runs CPU's kernels.
  m.impl("mode.values", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  // conj_physical_ is a composite that calls a DispatchStub, which has CPU's and CUDA's kernels and none for
  // npu ("DispatchStub: missing kernel for npu"): npu runs CPU's, as the fallback runs CPU's kernels.
  m.impl("conj_physical_", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}

}  // namespace npusim
