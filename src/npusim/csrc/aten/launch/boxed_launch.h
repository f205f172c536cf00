// One boxed launch of a compute op as a stream task (boxed_launch.cpp): the
// walk of the stack's arguments into the task's slots, the plan from the
// cache or the dispatcher's Meta kernel, the task; launch_boxed (op_launch.cpp)
// decides whether to launch and drives it. See Note [Compute on the stream].
#pragma once

#include "launch_args.h"
#include "meta_cache.h"
#include "op_task.h"
#include "../op_traits.h"
#include "../../runtime/stream.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace npusim {

class BoxedLaunch {
 public:
  BoxedLaunch(const c10::OperatorHandle& op, const OpTraits& traits);
  void walk(const torch::jit::Stack& stack, size_t first);
  c10::DeviceIndex device() const;
  const LaunchArgs& args() const;
  // The outputs' plan, from the cache or the Meta kernel; null when the op
  // must run on the host (why_host() says why).
  // With the timing model's compute cost on, the plan carries the op's
  // duration, asked of the cost hook once per plan and cost epoch.
  const MetaPlan* plan();
  const std::string& why_host() const;
  // Allocates the outputs, enqueues the task on `stream` and replaces the
  // arguments on `stack` with the outputs.
  void commit(const MetaPlan& plan, NpuStream& stream, torch::jit::Stack* stack, size_t first);

 private:
  // Whether the outputs of a unary foreach op's task are its fresh
  // results, one per input and in order, each of its input's dtype.
  static bool results_in_place(const OpTask& task);
  // Whether every return of a functional op's task is a fresh output, one
  // tensor each and in order, and its input one that `out` takes.
  static bool returns_fresh(const OpTask& task, const FunctionalOut& out);
  void add_argument(const c10::IValue& v, ArgUse use, bool generator);
  static void add_double(MetaKey& key, double d);
  // The words of a value argument; floating-point numbers by their kind
  // alone when `floats_by_kind` (OpTraits::floating_scalars_by_kind).
  static void add_value_words(MetaKey& key, const c10::IValue& v, bool floats_by_kind);
  // Runs the dispatcher's Meta kernel (C++, or Python for the ops whose Meta
  // kernels torch._meta_registrations provides) on the Meta stand-ins.
  void run_meta(bool keep_inputs);
  // Whether an out= tensor's dtype differs from the one the op's functional
  // overload returns there (Note [out= tensors of another dtype]); run after
  // run_meta, whose inputs it reuses.
  bool outs_of_another_dtype() const;
  at::ScalarType stats_dtype_of(const torch::jit::Stack& inputs) const;

  const c10::OperatorHandle& op_;
  const OpTraits& traits_;
  LaunchArgs args_;
  std::vector<ArgSlot> slots_;
  uint64_t generator_slots_ = 0;
  uint64_t npu_device_slots_ = 0;
  std::vector<c10::IValue> meta_inputs_;
  std::vector<c10::IValue> meta_outputs_;
  MetaPlan own_plan_;
  std::string why_host_;
};

}  // namespace npusim
