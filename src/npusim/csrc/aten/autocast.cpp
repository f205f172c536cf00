// torch.autocast("npu"): the same cast policies as CUDA, reusing PyTorch's
// own op lists for each policy.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using namespace at::autocast;  // the policy names used by the KERNEL macros

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

#define NPUSIM_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NPUSIM_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NPUSIM_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NPUSIM_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NPUSIM_LOWER_PRECISION_FP)
  AT_FORALL_FP32(NPUSIM_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NPUSIM_FP32_SET_OPT_DTYPE)
  AT_FORALL_PROMOTE(NPUSIM_PROMOTE)
}

}  // namespace
