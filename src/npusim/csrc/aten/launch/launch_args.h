// The npu tensors of one op launch (launch_args.cpp), shared by the boxed
// launch (op_launch.cpp) and the unboxed kernels of the hottest ops
// (fallback_routes.cpp): the walk under the device rules with its MetaKey,
// Meta stand-ins, the plan from the Meta kernel's results, out= resizes,
// the outputs and the task's snapshots. See Note [Compute on the stream].
#pragma once

#include "meta_cache.h"
#include "../op_arguments.h"
#include "../../runtime/stream.h"
#include "op_task.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include <string>
#include <vector>

namespace npusim {

class LaunchArgs {
 public:
  explicit LaunchArgs(const c10::OperatorHandle& op) : op_(op), rules_(op) {
    key_.begin(&op.schema());
  }
  LaunchArgs(const LaunchArgs&) = delete;
  LaunchArgs& operator=(const LaunchArgs&) = delete;

  // ---- the walk ---------------------------------------------------------------

  // One tensor argument: admitted by the device rules (or raising their
  // error), added to the key, and given a ref for the task. `t` must stay
  // alive and unchanged until the launch is committed (the caller's arguments).
  int32_t tensor(const at::Tensor& t, ArgUse use);
  MetaKey& key() {
    return key_;
  }
  DeviceRules& rules() {
    return rules_;
  }
  // The op's npu (the current one when no argument names one).
  c10::DeviceIndex device() const {
    return rules_.device();
  }
  // Whether the op writes an npu argument.
  bool written() const {
    return written_;
  }

  // ---- the Meta kernel (a cache miss) ------------------------------------------

  // Makes a Meta tensor of every npu argument (one Meta storage per storage).
  void make_meta();
  // The Meta kernel's form of tensor `ref` (a held CPU tensor as it is).
  at::Tensor meta(int32_t ref) const;
  // Builds `plan` from the Meta kernel's `results`, and notes the arguments
  // it resized (not cached). Raises when the results cannot be launched.
  void plan_from_meta(const std::vector<c10::IValue>& results, MetaPlan& plan);
  bool resizes_arguments() const {
    return !updates_.empty();
  }
  // Note [Resizing an output during capture]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // An out= resize is done on the host at launch (begin_task), so a capture
  // records the kernel over the final shape and a replay resizes nothing. A
  // fresh storage comes from the graph's pool, as CUDA's resize in a capture
  // allocates from it: this is how composite ops such as abs(x) (an empty
  // result handed to abs.out) are captured. What a capture refuses is growing
  // a storage that holds bytes: the stream-ordered copy of the old bytes
  // would be recorded reading a block freed at capture time, which a replay
  // cannot own (CUDA records that copy as it is, a read of freed memory).
  bool capture_refuses_resize() const {
    return !resize_message_.empty();
  }
  const std::string& resize_message() const {
    return resize_message_;
  }

  // ---- the launch ------------------------------------------------------------

  // Resizes the out= arguments as the Meta kernel did, then gives `task` the
  // snapshots of the npu arguments (taken now) and the held CPU tensors.
  // The op's npu must be the current device.
  void begin_task(TaskTensors& task, const MetaPlan& plan);
  // Output `p` of the plan as an npu tensor (fresh memory is allocated on
  // first use and recorded as a snapshot of `task`; its index is returned in
  // `snapshot`, else -1).
  at::Tensor output(const PlannedTensor& p, const MetaPlan& plan, TaskTensors& task, int32_t* snapshot);
  // What `task` (begun and given its outputs here) reads and writes: the
  // storage of each npu argument, written when its schema argument is, and
  // each fresh output, written (a capture's TaskAccess).
  TaskAccess access(const TaskTensors& task) const;

 private:
  struct Input {
    const at::Tensor* tensor;
    int32_t group;
    ArgUse use;
  };
  struct Update {
    int32_t input;
    at::Tensor meta;  // the argument as the Meta kernel left it
  };

  const c10::OperatorHandle& op_;
  DeviceRules rules_;
  MetaKey key_;
  c10::SmallVector<Input, 6> inputs_;
  c10::SmallVector<c10::StorageImpl*, 4> groups_;  // the storages, by group
  c10::SmallVector<int32_t, 4> group_first_;       // the first input of each group
  std::vector<at::Tensor> held_;
  bool written_ = false;
  // the Meta run
  c10::SmallVector<c10::Storage, 4> meta_groups_;
  c10::SmallVector<at::Tensor, 6> meta_inputs_;
  c10::SmallVector<Update, 1> updates_;
  std::string resize_message_;
  // the launch
  c10::SmallVector<c10::Storage, 2> fresh_;
  int32_t fresh_group_base_ = 0;
};

}  // namespace npusim
