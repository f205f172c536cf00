// The backend choice of scaled_dot_product_attention for npu tensors.
//
// Note [Fused attention on the npu]
// F.scaled_dot_product_attention asks a per-device DispatchStub which kernel to
// run (_fused_sdp_choice_stub). A device without an entry gets the math
// composite (matmul, softmax, matmul), whose rounding differs from the fused
// kernel CPU and CUDA take, so a training run on npu drifted from the same run
// on CPU. PrivateUse1's entry here is CPU's own choice for the tensors (its
// checks read sizes, strides, dtypes, requires_grad and the torch.backends SDPA
// switches, never the data), with CPU's flash kernel turned into
// "overrideable": PyTorch's slot for a backend's fused kernel, whose forward
// and backward (npusim/ops/attention.py) run CPU's flash kernels on device
// memory. Where CPU takes math (dropout, a mask that needs a gradient, flash
// switched off), npu takes math too.
#include <ATen/ATen.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

namespace at::native {  // REGISTER_PRIVATEUSE1_DISPATCH names the stub unqualified
namespace {

int64_t npu_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
    std::optional<double> scale, bool enable_gqa) {
  const int64_t cpu = at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU),
      query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  return cpu == static_cast<int64_t>(at::SDPBackend::flash_attention)
      ? static_cast<int64_t>(at::SDPBackend::overrideable) : cpu;
}

}  // namespace

REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &npu_fused_sdp_choice);

// The operator answers as the stub does (torch._fused_sdp_choice, meta and
// fake tensors of npu ask it).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", TORCH_FN(npu_fused_sdp_choice));
}

}  // namespace at::native
