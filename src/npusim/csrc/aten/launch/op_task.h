// One compute op as a stream task (op_task.cpp): the CPU kernel's tensors as
// the host saw them at launch, turned into CPU aliases on the stream's worker
// when the task runs, and the outputs the host allocated for its results. A
// graph replays the same task. See Note [Compute on the stream]
// (op_launch.cpp).
#pragma once

#include "../cpu_aliases.h"
#include "../generator.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace npusim {

struct FunctionalOut;  // op_traits.h

// A tensor the kernel gets: >= 0 a snapshot (an npu tensor), kUndefinedRef,
// or held_ref(i) (a CPU tensor held by the task).
constexpr int32_t kUndefinedRef = -1;
constexpr int32_t held_ref(size_t i) {
  return -2 - static_cast<int32_t>(i);
}

// The tensors of a task: snapshots of npu tensors (inputs and the outputs the
// host allocated) and the CPU tensors it holds.
struct TaskTensors {
  c10::DeviceIndex device = 0;
  int32_t groups = 0;  // storages among the snapshots
  std::vector<TensorSnapshot> tensors;
  std::vector<at::Tensor> held;  // CPU scalars and indices, as the host saw them at launch
  bool pointwise = false;  // OpTraits::pointwise of the task's op

  // Whether the task's kernel runs: always, except plan mode's large work (Note [Plan mode]).
  bool kernel_runs() const;
  // For a task whose kernel does not run: fresh output `snapshot` reads as
  // zeros (its block may hold an earlier small tensor's values).
  void clear_output(int32_t snapshot) const;
};

// The CPU tensors of one run of a task, made on first use: snapshots of one
// storage share one CPU storage, as kernels that check overlap expect.
class TaskAliases {
 public:
  explicit TaskAliases(const TaskTensors& tensors)
      : tensors_(tensors), storages_(static_cast<size_t>(tensors.groups)) {}
  at::Tensor get(int32_t ref);
  // An alias of snapshot `snapshot` over a storage of its own: a kernel
  // that resizes it re-points that storage alone, and no other alias of the
  // task follows it away from the device memory.
  at::Tensor own(int32_t snapshot);
  // Puts a kernel's `result` into the output of snapshot `snapshot` unless
  // the kernel wrote it there already.
  void place(const at::Tensor& result, int32_t snapshot, const char* op);

 private:
  const TaskTensors& tensors_;
  c10::SmallVector<c10::Storage, 4> storages_;
};

// What a task's CPU kernel runs under on the worker: the user's intra-op
// threads (less a core for the host for a small pointwise kernel: Note [A
// core for the host]), and below autograd (as on the host, where the kernel
// is reached from below the autograd and view keys). Its own allocations (temporaries,
// results to copy into the outputs) are host memory, not the caching
// allocator's: see Note [CPU kernels allocate device memory].
class KernelScope {
 public:
  explicit KernelScope(const TaskTensors& tensors);

 private:
  at::AutoDispatchBelowADInplaceOrView below_autograd_;
};

// One schema argument of a boxed kernel.
struct ArgSlot {
  enum class Kind : uint8_t { kValue, kTensor, kTensorList, kOptionalTensorList };
  Kind kind = Kind::kValue;
  c10::IValue value;  // kValue
  c10::SmallVector<int32_t, 1> refs;  // the tensors, in order (kOptionalTensorList: kUndefinedRef is None)
};

// The stack value of `slot`: its value, or its tensors with each ref's tensor
// from tensor_of(ref) (the Meta stand-ins when the launch asks the Meta
// kernel, the CPU aliases when the task runs the CPU kernel).
template <class TensorOf>
c10::IValue slot_value(const ArgSlot& slot, const TensorOf& tensor_of) {
  switch (slot.kind) {
    case ArgSlot::Kind::kValue:
      return slot.value;
    case ArgSlot::Kind::kTensor:
      return c10::IValue(tensor_of(slot.refs[0]));
    case ArgSlot::Kind::kTensorList: {
      c10::List<at::Tensor> list;
      list.reserve(slot.refs.size());
      for (const int32_t ref : slot.refs) {
        list.push_back(tensor_of(ref));
      }
      return c10::IValue(std::move(list));
    }
    case ArgSlot::Kind::kOptionalTensorList: {
      c10::List<std::optional<at::Tensor>> list;
      list.reserve(slot.refs.size());
      for (const int32_t ref : slot.refs) {
        list.push_back(ref == kUndefinedRef ? std::nullopt : std::optional<at::Tensor>(tensor_of(ref)));
      }
      return c10::IValue(std::move(list));
    }
  }
  return slot.value;
}

// A result of the kernel to place in an output the host allocated.
struct FreshOutput {
  uint32_t ret;      // return index
  int32_t elem;      // -1: the return is a tensor, else an index into its list
  int32_t snapshot;  // the output's snapshot
};

// A boxed op's task.
class OpTask : public TaskTensors {
 public:
  // The op the task calls; its results are copied into the outputs the
  // host allocated, unless functional_out says which out= variant writes
  // them there. The unboxed hot ops call their out= variants.
  c10::OperatorHandle op;
  const char* name = nullptr;
  std::vector<ArgSlot> args;
  std::vector<FreshOutput> fresh;
  // Captured: the generator arguments, CPU generators seeded from these
  // states each time the task runs (a replay draws fresh numbers).
  std::vector<std::pair<uint32_t, PhiloxState>> generators;
  // A unary foreach op's per-tensor out= op (OpTraits::foreach_unary_out),
  // when its outputs are fresh and of their inputs' dtypes: the task runs it
  // per tensor into those outputs instead of the op (Note [A foreach op's
  // results in place]).
  const c10::OperatorHandle* per_tensor_out = nullptr;
  // The out= variant the task runs into its fresh outputs instead of the
  // op, when each return is one (Note [A functional op's results in place]).
  const FunctionalOut* functional_out = nullptr;

  explicit OpTask(const c10::OperatorHandle& handle) : op(handle) {}

  // Runs the CPU kernel; may run again (a graph's replay).
  void run() const;
};

// How many tasks have run a unary foreach op per tensor into its outputs
// since the process started (for tests: Note [A foreach op's results in place]).
int64_t foreach_results_in_place_runs();

// How many kernel results a task has copied into the output the host
// allocated, since the process started: a functional CPU kernel's fresh
// result (an op without an out= variant, or one launched boxed), where an
// out= kernel writes that output itself (for tests: Note [Unboxed fallback
// kernels]).
int64_t results_copied_into_place();

}  // namespace npusim
