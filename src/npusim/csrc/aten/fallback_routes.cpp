// Which kernel fills the npu slot of the ops PyTorch gives a generic one:
// structured ops' functional and in-place variants, and the ops whose
// composite would stand in for CPU's own kernel, go straight to the CPU
// fallback (fallback.cpp).
#include "fallback.h"

#include "fallback_call.h"
#include "foreach_launch.h"
#include "iterator_kernels.h"
#include "launch/launch_scan.h"
#include "launch/written_overlap.h"
#include "launch/op_launch.h"
#include "launch/unboxed_launch.h"

#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Gelu.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addr.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/amax_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/clamp_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/lt_ops.h>
#include <ATen/ops/gt_ops.h>
#include <ATen/ops/maximum_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/ne_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_backward_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_backward_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_backward_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/_log_softmax_meta_dispatch.h>
#include <ATen/ops/_log_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_softmax_meta_dispatch.h>
#include <ATen/ops/_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/addcdiv_meta_dispatch.h>
#include <ATen/ops/addcmul_meta_dispatch.h>
#include <ATen/ops/addmm_meta_dispatch.h>
#include <ATen/ops/amax_meta_dispatch.h>
#include <ATen/ops/bmm_meta_dispatch.h>
#include <ATen/ops/clamp_meta_dispatch.h>
#include <ATen/ops/div_meta_dispatch.h>
#include <ATen/ops/eq_meta_dispatch.h>
#include <ATen/ops/exp_meta_dispatch.h>
#include <ATen/ops/gelu_meta_dispatch.h>
#include <ATen/ops/gelu_backward_meta_dispatch.h>
#include <ATen/ops/gt_meta_dispatch.h>
#include <ATen/ops/log_meta_dispatch.h>
#include <ATen/ops/lt_meta_dispatch.h>
#include <ATen/ops/maximum_meta_dispatch.h>
#include <ATen/ops/mean_meta_dispatch.h>
#include <ATen/ops/mm_meta_dispatch.h>
#include <ATen/ops/mul_meta_dispatch.h>
#include <ATen/ops/ne_meta_dispatch.h>
#include <ATen/ops/neg_meta_dispatch.h>
#include <ATen/ops/pow_meta_dispatch.h>
#include <ATen/ops/rsqrt_meta_dispatch.h>
#include <ATen/ops/sigmoid_meta_dispatch.h>
#include <ATen/ops/sigmoid_backward_meta_dispatch.h>
#include <ATen/ops/silu_meta_dispatch.h>
#include <ATen/ops/silu_backward_meta_dispatch.h>
#include <ATen/ops/sqrt_meta_dispatch.h>
#include <ATen/ops/sub_meta_dispatch.h>
#include <ATen/ops/sum_meta_dispatch.h>
#include <ATen/ops/tanh_meta_dispatch.h>
#include <ATen/ops/tanh_backward_meta_dispatch.h>
#include <ATen/ops/threshold_backward_meta_dispatch.h>
#include <torch/library.h>

#include <array>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace npusim {

// Note [Structured ops go straight to the fallback]
// A structured op (add, mul, mm, sum, ...) has CPU and CUDA kernels for
// each of its variants, but every other backend's slot of the functional
// (add.Tensor) and in-place (add_.Tensor) variants holds the generated
// CompositeExplicitAutogradNonFunctional kernel: it runs the op's meta
// function (a TensorIterator for add) on the npu tensors, allocates the
// output through the npu allocator and calls the out= variant, which has no
// npu kernel and so reaches the fallback, which builds everything again for
// the CPU kernel. Two dispatches and two TensorIterators per op, for the
// same result the CPU kernel of the functional variant computes on its own.
// So at import npusim registers the fallback as the npu kernel of every aten
// op whose npu slot would hold a CompositeExplicitAutogradNonFunctional
// kernel and that has a CPU kernel of its own, and leaves alone every op
// that shares its name with an op npusim has an npu kernel for (the random
// ops' out= variants draw from the npu generator, for one): the rule sees
// only registrations, so it stays right as PyTorch adds ops. The device
// rules are the fallback's (Note [Device rules of the fallback]), the same
// ones the out= variant met before; outputs come from the npu caching
// allocator as before (Note [CPU kernels allocate device memory]); shape and
// dtype errors are the CPU meta functions', which the composite kernel ran
// too. Under graph capture the fallback records the op itself and sizes its
// outputs on Meta (Note [NPU graph capture]).

// Note [CPU's kernel, not the composite]
// The same rule covers every other op whose npu slot would hold a composite
// kernel where CPU has a kernel of its own: a CompositeExplicitAutograd one
// (addr's math_addr, native_group_norm's math_group_norm, native_layer_norm's
// math_native_layer_norm: generic versions for backends without a kernel,
// which round fp16/bf16 differently from the kernels CPU and CUDA run) or a
// CompositeImplicitAutograd one (mish_backward's math_mish_backward). The
// two kinds differ in where they sit relative to autograd:
//  - CompositeExplicitAutograd and ...NonFunctional kernels sit below
//    autograd: the op's Autograd kernel (its derivatives.yaml formula) runs
//    above either way, so giving the npu slot the CPU kernel changes only the
//    kernel.
//  - A CompositeImplicitAutograd kernel decomposes above autograd: with no npu
//    kernel, AutogradPrivateUse1 runs the decomposition and autograd
//    differentiates its pieces. Once the npu slot has a kernel,
//    AutogradPrivateUse1 takes the op's Autograd kernel instead, as
//    AutogradCPU does. So such an op is routed only when it has an Autograd
//    kernel (a formula); one without would lose its gradient on npu.
// Not routed: ops for which CUDA has no kernel and runs the composite itself
// (pixel_shuffle, narrow_copy, native_channel_shuffle, _stack): npu follows
// CUDA (Note [npu follows CUDA where CPU differs], cuda_semantics.cpp), which
// for pixel_shuffle means a contiguous result of a channels_last input where
// CPU's kernel keeps channels_last. Ops with a CUDA kernel and no CPU one
// have no CPU kernel to route to: _chunk_cat runs the composite CPU runs,
// and the _foreach_* family runs that composite as one launch (Note [A
// foreach op is one launch], foreach_launch.cpp). The
// dispatcher of a CPU build holds no CUDA registrations, so Python passes
// their names (ops/routes.py: CUDA_RUNS_THE_COMPOSITE, checked against
// PyTorch's native_functions.yaml by tests/test_fallback_routes.py).

// Note [Unboxed fallback kernels]
// A boxed kernel costs its caller a boxing of the arguments: a stack vector,
// an IValue per argument, and for a tensor that only Python held, a
// reference count that has to take the GIL (PyObject preservation, about
// 400 instructions each way) -- and the fallback then unboxes them again for
// the CPU kernel. For the hottest routed ops (elementwise arithmetic,
// activations, matmuls, reductions, softmax: the steps of a training loop)
// npusim registers an unboxed kernel instead, UnboxedFallback<Op>, which
// takes the arguments as the dispatcher has them, makes CPU aliases of the
// tensors with the same FallbackCall (so the same device rules and results),
// and calls the CPU kernel unboxed through Op::redispatch. Only ops the rule
// above routes get one, only functional variants and in-place variants that
// write and return their first argument. On a.add(b) this saved 2.3k of
// 16.9k instructions (Note [Cost of the fallback]). Its task also calls the
// op's out= variant into the output the host allocated, where the boxed
// route's task runs the functional kernel and copies its fresh result there
// (TaskAliases::place). A graph capture records the same unboxed task, so
// each replay keeps that: the boxed route, which captures used to take,
// made every replayed matmul allocate its result and copy it, 256 KiB for a
// 256x256 weight gradient, and the MLP's backward graph of `bench
// graph-replay` replayed in 217-231 us against 172-180 us now (alternating
// processes, 2026-12-07). Ops launched while another stream is captured,
// and those given to the compute-cost hook, take the boxed route.

namespace {

// ---- unboxed kernels --------------------------------------------------------

using Use = FallbackCall::Use;

// How an unboxed argument reaches the CPU kernel: tensors as their aliases,
// everything else as it is. Argument kinds without a rule here (tensor
// lists, generators, devices) fail to compile: those ops stay boxed.
template <class T>
struct CpuArg {
  static_assert(!std::is_same_v<std::decay_t<T>, std::optional<at::Generator>> &&
          !std::is_same_v<std::decay_t<T>, std::optional<c10::Device>> &&
          !std::is_same_v<std::decay_t<T>, at::TensorList> &&
          !std::is_same_v<std::decay_t<T>, at::ITensorListRef>,
      "this argument kind has no unboxed fallback rule; leave the op boxed");
  using type = T;
  static T get(FallbackCall&, T v, Use) {
    return v;
  }
};
template <>
struct CpuArg<const at::Tensor&> {
  using type = at::Tensor;
  static at::Tensor get(FallbackCall& call, const at::Tensor& t, Use use) {
    return call.alias(t, use);
  }
};
template <>
struct CpuArg<at::Tensor&> {
  using type = at::Tensor;
  static at::Tensor get(FallbackCall& call, const at::Tensor& t, Use use) {
    return call.alias(t, use);
  }
};
template <>
struct CpuArg<const std::optional<at::Tensor>&> {
  using type = std::optional<at::Tensor>;
  static std::optional<at::Tensor> get(FallbackCall& call, const std::optional<at::Tensor>& t, Use use) {
    return t.has_value() ? std::optional<at::Tensor>(call.alias(*t, use)) : std::nullopt;
  }
};

template <class Op, class OutOp, class MetaFn, class Sig = typename Op::schema>
struct UnboxedFallback;

template <class Op, class OutOp, class MetaFn, class R, class... Args>
struct UnboxedFallback<Op, OutOp, MetaFn, R(Args...)> {
  static_assert(std::is_same_v<R, at::Tensor> || std::is_same_v<R, at::Tensor&>,
      "unboxed fallback kernels return one tensor");

  static R call(c10::DispatchKeySet keys, Args... args) {
    const c10::OperatorHandle& op = handle();
    LaunchScan scan;
    (scan.add(args), ...);
    if (C10_UNLIKELY(any_stream_capturing() || compute_cost_hook() != nullptr || scan.complex_half)) {
      if (compute_cost_hook() == nullptr && scan.stream().capture() != nullptr) {
        return launch(op, keys, args...);  // recorded by the capture: Note [Unboxed fallback kernels]
      }
      // Given to the cost hook, beside another stream's capture, or complex32 (Note [complex32 on the host]).
      return boxed(keys, args...);
    }
    if constexpr (std::is_same_v<R, at::Tensor&>) {
      if (C10_UNLIKELY(self_overlaps(args...))) {
        return boxed(keys, args...);  // run on the host: Note [Written tensors that overlap]
      }
    }
    if (compute_on_the_host_now(scan)) {
      if constexpr (IteratorKernel<Op>::value) {
        // Note [TensorIterator kernels on npu tensors]
        at::Tensor result;
        if (IteratorKernel<Op>::run(&result, args...)) {
          if constexpr (std::is_same_v<R, at::Tensor&>) {
            return std::get<0>(std::forward_as_tuple(args...));
          } else {
            return result;
          }
        }
      }
      FallbackCall call(op);
      return run(call, std::index_sequence_for<Args...>{}, args...);
    }
    return launch(op, keys, args...);  // a stream task: Note [Compute on the stream]
  }

  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return op;
  }

 private:
  // The op as a stream task (or recorded by the stream's capture), its task
  // calling the CPU kernel unboxed; the boxed route where the unboxed launch
  // does not take the plan (a host run, a resize, several outputs), which
  // also raises a capture's refusals.
  static R launch(const c10::OperatorHandle& op, c10::DispatchKeySet keys, Args... args) {
    at::Tensor result;
    if (!launch_unboxed<Op, OutOp, MetaFn, Args...>(op, name(), uses(), &result, args...)) {
      return boxed(keys, args...);
    }
    if constexpr (std::is_same_v<R, at::Tensor&>) {
      return std::get<0>(std::forward_as_tuple(args...));  // an in-place op returns its self
    } else {
      return result;
    }
  }

  static R boxed(c10::DispatchKeySet keys, Args... args) {
    return c10::impl::BoxedKernelWrapper<R(Args...)>::call(
        c10::BoxedKernel::makeFromFunction<&npu_fallback>(), handle(), keys, args...);
  }

  static const char* name() {
    static const char* const interned = interned_op_name(handle());
    return interned;
  }

  static const std::array<Use, sizeof...(Args)>& uses() {
    static const std::array<Use, sizeof...(Args)> table = [] {
      std::array<Use, sizeof...(Args)> out{};
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = FallbackCall::use_of(handle().schema().arguments()[i]);
      }
      return out;
    }();
    return table;
  }

  template <size_t... I>
  static R run(FallbackCall& call, std::index_sequence<I...>, Args... args) {
    // Braces: the aliases are made in argument order, as the boxed fallback
    // makes them, so the device errors name the same devices.
    std::tuple<typename CpuArg<Args>::type...> cpu{CpuArg<Args>::get(call, args, uses()[I])...};
    auto out = call.run([&] {
      return Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), std::get<I>(cpu)...);
    });
    if constexpr (std::is_same_v<R, at::Tensor&>) {
      return std::get<0>(std::forward_as_tuple(args...));  // an in-place op returns its self
    } else {
      return call.back(out);
    }
  }
};

struct UnboxedKernel {
  torch::CppFunction (*make)();
  bool in_place;  // writes and returns its first argument
};

// Op's unboxed kernel; OutOp (or void) its out= variant, MetaFn its C++ meta function.
template <class Op, class OutOp, class MetaFn>
UnboxedKernel unboxed() {
  using R = c10::guts::infer_function_traits_t<typename Op::schema>::return_type;
  return UnboxedKernel{[] { return torch::CppFunction(TORCH_FN((&UnboxedFallback<Op, OutOp, MetaFn>::call))); },
      std::is_same_v<R, at::Tensor&>};
}

// The type of a call of at::meta::fn (the op's structured meta function).
#define NPUSIM_META(fn) decltype([](auto&... a) -> at::Tensor { return at::meta::fn(a...); })

// Note [Half-to-float softmax as CUDA's]
// CUDA's softmax and log_softmax take half_to_float=True (a Half input and a
// float32 result computed in fp32), and their backward takes a float32 grad
// and output with input_dtype Half (a Half gradient): the pair that a
// softmax computed in fp32 for half inputs differentiates through. CPU's
// kernels refuse both. npu follows CUDA (Note [npu follows CUDA where CPU
// differs] in cuda_semantics.cpp): the input is widened to fp32 on the
// device and the fp32 kernel runs, as CUDA accumulates in fp32; the backward
// runs in fp32 and rounds its result to Half once. Other dtypes get CUDA's
// errors. Without a conversion (every other call) the op is the unboxed
// fallback as before, behind one branch.
template <class Fallback, at::Tensor (*Fp32)(const at::Tensor&, int64_t, bool)>
at::Tensor softmax_as_cuda(c10::DispatchKeySet keys, const at::Tensor& self, int64_t dim, bool half_to_float) {
  if (C10_LIKELY(!half_to_float)) {
    return Fallback::call(keys, self, dim, half_to_float);
  }
  TORCH_CHECK(self.scalar_type() == at::kHalf, "conversion is supported for Half type only");
  return Fp32(self.to(at::kFloat), dim, false);
}

template <class Fallback, at::Tensor (*Fp32)(const at::Tensor&, const at::Tensor&, int64_t, at::ScalarType)>
at::Tensor softmax_backward_as_cuda(c10::DispatchKeySet keys, const at::Tensor& grad, const at::Tensor& output,
    int64_t dim, at::ScalarType input_dtype) {
  if (C10_LIKELY(grad.scalar_type() == input_dtype)) {
    return Fallback::call(keys, grad, output, dim, input_dtype);
  }
  TORCH_CHECK(grad.scalar_type() == at::kFloat && input_dtype == at::kHalf,
      "expected input and grad types to match, or input to be at::Half and grad to be at::Float");
  return Fp32(grad, output, dim, at::kFloat).to(at::kHalf);
}

// gelu's approximate argument, which only the CPU kernel checks (its C++ meta
// function lets any string through): checked at the call, as CUDA's host
// code does, so that a task does not fail the device with it (Note [Argument
// checks of CPU kernels]). Two string compares per launch.
template <class Fallback>
at::Tensor gelu_as_cuda(c10::DispatchKeySet keys, const at::Tensor& self, c10::string_view approximate) {
  at::native::get_gelutype_enum(approximate);
  return Fallback::call(keys, self, approximate);
}

template <class Fallback>
at::Tensor gelu_backward_as_cuda(c10::DispatchKeySet keys, const at::Tensor& grad_output, const at::Tensor& self,
    c10::string_view approximate) {
  at::native::get_gelutype_enum(approximate);
  return Fallback::call(keys, grad_output, self, approximate);
}

// The hottest routed ops, by name; see Note [Unboxed fallback kernels].
const std::unordered_map<std::string, UnboxedKernel>& unboxed_kernels() {
  namespace ops = at::_ops;
  static const std::unordered_map<std::string, UnboxedKernel> kernels = {
      {"aten::add.Tensor", unboxed<ops::add_Tensor, ops::add_out, NPUSIM_META(add)>()},
      {"aten::add_.Tensor", unboxed<ops::add__Tensor, void, NPUSIM_META(add_)>()},
      {"aten::sub.Tensor", unboxed<ops::sub_Tensor, ops::sub_out, NPUSIM_META(sub)>()},
      {"aten::sub_.Tensor", unboxed<ops::sub__Tensor, void, NPUSIM_META(sub_)>()},
      {"aten::mul.Tensor", unboxed<ops::mul_Tensor, ops::mul_out, NPUSIM_META(mul)>()},
      {"aten::mul_.Tensor", unboxed<ops::mul__Tensor, void, NPUSIM_META(mul_)>()},
      {"aten::div.Tensor", unboxed<ops::div_Tensor, ops::div_out, NPUSIM_META(div)>()},
      {"aten::div_.Tensor", unboxed<ops::div__Tensor, void, NPUSIM_META(div_)>()},
      {"aten::addcmul", unboxed<ops::addcmul, ops::addcmul_out, NPUSIM_META(addcmul)>()},
      {"aten::addcmul_", unboxed<ops::addcmul_, void, NPUSIM_META(addcmul_)>()},
      {"aten::addcdiv", unboxed<ops::addcdiv, ops::addcdiv_out, NPUSIM_META(addcdiv)>()},
      {"aten::addcdiv_", unboxed<ops::addcdiv_, void, NPUSIM_META(addcdiv_)>()},
      {"aten::neg", unboxed<ops::neg, ops::neg_out, NPUSIM_META(neg)>()},
      {"aten::exp", unboxed<ops::exp, ops::exp_out, NPUSIM_META(exp)>()},
      {"aten::log", unboxed<ops::log, ops::log_out, NPUSIM_META(log)>()},
      {"aten::sqrt", unboxed<ops::sqrt, ops::sqrt_out, NPUSIM_META(sqrt)>()},
      {"aten::rsqrt", unboxed<ops::rsqrt, ops::rsqrt_out, NPUSIM_META(rsqrt)>()},
      {"aten::pow.Tensor_Scalar", unboxed<ops::pow_Tensor_Scalar, ops::pow_Tensor_Scalar_out, NPUSIM_META(pow)>()},
      {"aten::maximum", unboxed<ops::maximum, ops::maximum_out, NPUSIM_META(maximum)>()},
      {"aten::clamp", unboxed<ops::clamp, ops::clamp_out, NPUSIM_META(clamp)>()},
      {"aten::eq.Tensor", unboxed<ops::eq_Tensor, ops::eq_Tensor_out, NPUSIM_META(eq)>()},
      {"aten::eq.Scalar", unboxed<ops::eq_Scalar, ops::eq_Scalar_out, NPUSIM_META(eq)>()},
      {"aten::ne.Scalar", unboxed<ops::ne_Scalar, ops::ne_Scalar_out, NPUSIM_META(ne)>()},
      {"aten::gt.Scalar", unboxed<ops::gt_Scalar, ops::gt_Scalar_out, NPUSIM_META(gt)>()},
      {"aten::lt.Scalar", unboxed<ops::lt_Scalar, ops::lt_Scalar_out, NPUSIM_META(lt)>()},
      {"aten::sigmoid", unboxed<ops::sigmoid, ops::sigmoid_out, NPUSIM_META(sigmoid)>()},
      {"aten::sigmoid_backward",
          unboxed<ops::sigmoid_backward, ops::sigmoid_backward_grad_input, NPUSIM_META(sigmoid_backward)>()},
      {"aten::tanh", unboxed<ops::tanh, ops::tanh_out, NPUSIM_META(tanh)>()},
      {"aten::tanh_backward", unboxed<ops::tanh_backward, ops::tanh_backward_grad_input, NPUSIM_META(tanh_backward)>()},
      {"aten::gelu", UnboxedKernel{[] {
         using Fallback = UnboxedFallback<ops::gelu, ops::gelu_out, NPUSIM_META(gelu)>;
         return torch::CppFunction(TORCH_FN((&gelu_as_cuda<Fallback>)));
       }, false}},
      {"aten::gelu_backward", UnboxedKernel{[] {
         using Fallback =
             UnboxedFallback<ops::gelu_backward, ops::gelu_backward_grad_input, NPUSIM_META(gelu_backward)>;
         return torch::CppFunction(TORCH_FN((&gelu_backward_as_cuda<Fallback>)));
       }, false}},
      {"aten::silu", unboxed<ops::silu, ops::silu_out, NPUSIM_META(silu)>()},
      {"aten::silu_backward", unboxed<ops::silu_backward, ops::silu_backward_grad_input, NPUSIM_META(silu_backward)>()},
      {"aten::threshold_backward",
          unboxed<ops::threshold_backward, ops::threshold_backward_grad_input, NPUSIM_META(threshold_backward)>()},
      {"aten::mm", unboxed<ops::mm, ops::mm_out, NPUSIM_META(mm)>()},
      {"aten::bmm", unboxed<ops::bmm, ops::bmm_out, NPUSIM_META(bmm)>()},
      {"aten::addmm", unboxed<ops::addmm, ops::addmm_out, NPUSIM_META(addmm)>()},
      {"aten::sum.dim_IntList", unboxed<ops::sum_dim_IntList, ops::sum_IntList_out, NPUSIM_META(sum)>()},
      {"aten::mean.dim", unboxed<ops::mean_dim, ops::mean_out, NPUSIM_META(mean)>()},
      {"aten::amax", unboxed<ops::amax, ops::amax_out, NPUSIM_META(amax)>()},
      // Note [Half-to-float softmax as CUDA's]
      {"aten::_softmax", UnboxedKernel{[] {
         using Fallback = UnboxedFallback<ops::_softmax, ops::_softmax_out, NPUSIM_META(_softmax)>;
         return torch::CppFunction(TORCH_FN((&softmax_as_cuda<Fallback, &at::_softmax>)));
       }, false}},
      {"aten::_softmax_backward_data", UnboxedKernel{[] {
         using Fallback = UnboxedFallback<ops::_softmax_backward_data, ops::_softmax_backward_data_out,
             NPUSIM_META(_softmax_backward_data)>;
         return torch::CppFunction(TORCH_FN((&softmax_backward_as_cuda<Fallback, &at::_softmax_backward_data>)));
       }, false}},
      {"aten::_log_softmax", UnboxedKernel{[] {
         using Fallback = UnboxedFallback<ops::_log_softmax, ops::_log_softmax_out, NPUSIM_META(_log_softmax)>;
         return torch::CppFunction(TORCH_FN((&softmax_as_cuda<Fallback, &at::_log_softmax>)));
       }, false}},
      {"aten::_log_softmax_backward_data", UnboxedKernel{[] {
         using Fallback = UnboxedFallback<ops::_log_softmax_backward_data, ops::_log_softmax_backward_data_out,
             NPUSIM_META(_log_softmax_backward_data)>;
         return torch::CppFunction(TORCH_FN((&softmax_backward_as_cuda<Fallback, &at::_log_softmax_backward_data>)));
       }, false}},
  };
  return kernels;
}

// Whether `op`'s schema is what its UnboxedKernel assumes: an in-place
// variant writes its first argument and returns it, a functional one writes
// nothing.
bool fits(const c10::FunctionSchema& schema, const UnboxedKernel& kernel) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const bool written = FallbackCall::use_of(args[i]) == Use::kWritten;
    if (written != (kernel.in_place && i == 0)) {
      return false;
    }
  }
  return schema.returns().size() == 1 &&
      (!kernel.in_place || (schema.returns()[0].alias_info() != nullptr && !args.empty() &&
                               args[0].alias_info() != nullptr &&
                               *schema.returns()[0].alias_info() == *args[0].alias_info()));
}

// ---- the rule -----------------------------------------------------------------

// The name an op's functional, in-place and out= overloads share ("add" for
// aten::add.Tensor, aten::add_.Tensor and aten::add.out).
std::string base_name(const c10::OperatorName& name) {
  std::string base = name.name.substr(name.name.find("::") + 2);
  if (base.size() > 2 && base.back() == '_' && base.compare(base.size() - 2, 2, "__") != 0) {
    base.pop_back();
  }
  return base;
}

// Whether `op`'s npu slot, without a kernel of its own, would hold a
// composite that CPU's own kernel should replace (Note [CPU's kernel, not the
// composite]).
bool composite_stands_in_for_cpu_kernel(const c10::OperatorHandle& op) {
  using c10::DispatchKey;
  if (!op.hasKernelForDispatchKey(DispatchKey::CPU)) {
    return false;
  }
  return op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional) ||
      op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
      (op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd) &&
          op.hasKernelForDispatchKey(DispatchKey::Autograd));
}

// Note [addr_ is in place by identity]
// addr_ has no kernel of its own on any backend: its composite calls
// at::addr_out(self, self, vec1, vec2), and the CPU and CUDA kernel of that
// (build_addr_iter) tells an in-place call by the identity of its two Tensor
// references (&result == &self). In place, self is not expanded, so it must
// be 2-D and of the result's shape already ("2D tensor expected, got 0D
// tensor for input", "size mismatch, input: [1, 4], v1: [3], v2: [4]").
// npu's addr.out kernel is the boxed fallback, whose stack holds two copies
// of the reference, so the identity was lost: self was expanded like an
// out= call's input, and the result then resized it (PyTorch's deprecation
// warning and a [3, 4] self, where CPU and CUDA raise; the misuse sweep of
// issue 41). This kernel makes the in-place call's checks, in PyTorch 2.13's
// order and with its messages, then the composite's call, which the checks
// leave nothing to expand or resize. The kernel is registered with the
// routes, after their scan: an op with an npu kernel of its own keeps its
// family's composites, and addr and addr.out must still run CPU's kernel, as
// CUDA runs it (Note [CPU's kernel, not the composite]: the composite rounds
// fp16 and bf16 otherwise).
at::Tensor& addr_in_place(at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2, const at::Scalar& beta,
    const at::Scalar& alpha) {
  for (const auto& [vec, name] : {std::pair{&vec1, "vec1"}, std::pair{&vec2, "vec2"}}) {
    TORCH_CHECK(vec->dim() == 1, "addr: Expected 1-D argument ", name, ", but got ", vec->dim(), "-D");
  }
  TORCH_CHECK(self.dim() == 2, "2D tensor expected, got ", self.dim(), "D tensor for input");
  TORCH_CHECK(self.size(0) == vec1.size(0) && self.size(1) == vec2.size(0), "size mismatch, input: ",
      self.sizes(), ", v1: ", vec1.sizes(), ", v2: ", vec2.sizes());
  return at::addr_out(self, self, vec1, vec2, beta, alpha);
}

}  // namespace

std::map<std::string, std::string> route_structured_ops_to_fallback(
    const std::vector<std::string>& cuda_runs_the_composite) {
  static const std::map<std::string, std::string> routed = [&] {
    const std::unordered_set<std::string> keep(cuda_runs_the_composite.begin(), cuda_runs_the_composite.end());
    auto& dispatcher = c10::Dispatcher::singleton();
    std::unordered_set<std::string> own;  // aten ops with an npu kernel of their own, by base name
    std::vector<c10::OperatorHandle> candidates;
    std::vector<c10::OperatorHandle> foreach_ops;  // Note [A foreach op is one launch]
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) {
        continue;
      }
      const std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
      if (!op.has_value()) {
        continue;
      }
      if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
        own.insert(base_name(name));
      } else if (composite_stands_in_for_cpu_kernel(*op)) {
        candidates.push_back(*op);
      } else if (foreach_op_takes_one_launch(*op)) {
        foreach_ops.push_back(*op);
      }
    }
    // Leaked: the registrations live as long as the process.
    auto* library = new torch::Library(
        torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    std::map<std::string, std::string> names;
    for (const c10::OperatorHandle& op : candidates) {
      const c10::OperatorName& name = op.operator_name();
      if (own.count(base_name(name)) != 0) {
        continue;
      }
      std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
      if (keep.count(full) != 0) {
        continue;
      }
      const auto unboxed = unboxed_kernels().find(full);
      if (unboxed != unboxed_kernels().end() && fits(op.schema(), unboxed->second)) {
        library->impl(full.c_str(), unboxed->second.make());
        names.emplace(std::move(full), "unboxed");
      } else {
        library->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
        names.emplace(std::move(full), "boxed");
      }
    }
    // After the scan, so that addr and addr.out are routed above: Note [addr_ is in place by identity].
    library->impl("addr_", TORCH_FN(addr_in_place));
    names.emplace("aten::addr_", "checked in place");
    for (const c10::OperatorHandle& op : foreach_ops) {
      const c10::OperatorName& name = op.operator_name();
      if (own.count(base_name(name)) != 0) {
        continue;  // _foreach_copy_ and its variants: npusim's own kernels
      }
      std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
      library->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&foreach_launch>());
      names.emplace(std::move(full), "foreach");
    }
    return names;
  }();
  return routed;
}

}  // namespace npusim
