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
//     parameters; CUDA computes in fp32 for any mix, as npu does here.
//  3. Fused RNN cells (npusim/ops/rnn_cells.py): LSTM / GRU on a PrivateUse1
//     tensor call the fused cells CUDA has (_thnn_fused_lstm_cell,
//     _thnn_fused_gru_cell) and CPU lacks; npu implements them.
//  4. SyncBatchNorm statistics (npusim/ops/sync_batch_norm.py):
//     batch_norm_stats and the four ops after it exist for CUDA only.
//  5. Fork after use (runtime.cpp, Note [Fork after npu use]): the child
//     raises, as CUDA's does; CPU has no such state.
#include "fallback.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <initializer_list>

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

// Runs aten::<name> through the CPU fallback with these arguments.
std::vector<c10::IValue> run_fallback(const char* name, std::vector<c10::IValue> args) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(const at::Tensor& grad_out,
    const at::Tensor& input, const OptTensor& weight, const OptTensor& running_mean,
    const OptTensor& running_var, const OptTensor& save_mean, const OptTensor& save_invstd,
    bool train, double eps, std::array<bool, 3> output_mask) {
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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  m.impl("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward));
}

}  // namespace npusim
