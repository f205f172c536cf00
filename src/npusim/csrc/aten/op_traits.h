// What the launch of a fallback op needs to know about the operator itself,
// worked out once per operator (op_traits.cpp): its name for tasks and
// errors, whether it must run on the host, and its arguments' uses. See Note [Compute on the stream] (op_launch.cpp).
#pragma once

#include "host_checks.h"
#include "op_arguments.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>


namespace npusim {

// The out= variant whose kernel a functional op's own CPU kernel runs into a
// fresh result: its task runs it into the outputs the host allocated
// instead (Note [A functional op's results in place], op_traits.cpp).
struct FunctionalOut {
  c10::OperatorHandle op;
  // An argument the out= variant takes after the op's own and before its
  // outputs (relu runs clamp_min.out with min 0); None when there is none.
  c10::IValue extra;
  // The op's own kernel refuses a Bool input before it runs `op` (relu): a
  // Bool input keeps the op's own kernel, and so its error.
  bool not_for_bool = false;
};

struct OpTraits {
  // "aten::add.Tensor": the task's name in errors and profiler traces,
  // interned (it lives as long as the process, as NpuStream::enqueue needs).
  const char* name = nullptr;
  // Why the op cannot be a stream task and runs on the host after the
  // stream's earlier work; null when it can be one.
  const char* host_only = nullptr;
  // Normalization ops whose CPU kernel returns its statistics in another
  // dtype than its Meta kernel (Note [Statistics dtypes of CPU norms]):
  // the schema index of the argument whose dtype the statistics returns
  // take (the weight; the input when it is undefined), or -1.
  int stats_dtype_from = -1;
  // For those ops: whether CPU's kernel saves no statistics (empty tensors,
  // where the Meta kernel sizes them by channel): kStatsAlways never,
  // kStatsNever always (an eval-only batch norm), else the schema index of
  // the `training` flag, saving none when it is false.
  static constexpr int kStatsAlways = -1;
  static constexpr int kStatsNever = -2;
  int stats_saved_unless = kStatsAlways;
  // Each output element is computed from the inputs' elements alone (the
  // op, or a foreach op's per-tensor op, carries PyTorch's pointwise tag):
  // its result does not depend on the intra-op team (Note [A core for the
  // host]).
  bool pointwise = false;
  // A pointwise _foreach_* op: its outputs' metadata depends on the kinds of
  // its floating-point scalars, not their values (an optimizer's bias
  // corrections change every step), so the cache of output metadata keys
  // them by kind (Note [Cached output metadata]).
  bool floating_scalars_by_kind = false;
  // A unary foreach op, _foreach_X(Tensor[] self) -> Tensor[]: aten::X.out,
  // which its task runs per tensor into the outputs the host allocated
  // (Note [A foreach op's results in place]); null otherwise. Lives as long
  // as the traits.
  const c10::OperatorHandle* foreach_unary_out = nullptr;
  // A functional op computed by an out= variant's kernel (FunctionalOut);
  // null otherwise. Lives as long as the traits.
  const FunctionalOut* functional_out = nullptr;
  // An out= op's functional overload (aten::softmax.int for aten::softmax.int_out), whose Meta kernel
  // gives the dtypes its out= tensors should have, and the count of those out= arguments, the schema's last
  // (Note [out= tensors of another dtype], op_launch.cpp); null and 0 otherwise. Lives as long as the traits.
  const c10::OperatorHandle* functional_of_out = nullptr;
  size_t out_args = 0;
  // Checks the op's CPU kernel makes on its arguments and its Meta kernel
  // does not, run at a launch that makes the op a stream task (Note
  // [Argument checks of CPU kernels], host_checks.cpp); null for most ops.
  HostCheck host_check = nullptr;
  // Per schema argument: how the op uses it, and whether it is a Generator?.
  c10::SmallVector<ArgUse, 8> uses;
  c10::SmallVector<bool, 8> generator;
};

// The traits of `op`; computed on first use, then one lookup.
const OpTraits& op_traits(const c10::OperatorHandle& op);

// Whether `op` is pointwise as OpTraits::pointwise says.
bool is_pointwise(const c10::OperatorHandle& op);

// The op's name as op_traits gives it, for ops known at compile time.
const char* interned_op_name(const c10::OperatorHandle& op);

}  // namespace npusim
