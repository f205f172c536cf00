// ProcessGroupNpu: the c10d backend for npu tensors. Data moves through an
// internal ProcessGroupGloo over CPU aliases of device memory (device memory
// is host memory); ordering follows NCCL (see Note [Comm stream]).
#pragma once

#include "comm_stream.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace npusim::dist {

// Its own type only so that Python can deep-copy it: split_group() copies
// the parent's options (`copy.deepcopy(backend.options)`).
struct NpuOptions : c10d::Backend::Options {
  using c10d::Backend::Options::Options;
};

class ProcessGroupNpu final : public c10d::Backend {
 public:
  // `gloo` is a ProcessGroupGloo of the same ranks on its own store prefix,
  // or, in a planned world where this process is the one rank that runs, a
  // MirrorBackend (Note [A planned world]).
  // global_ranks: the group's ranks in the default group, in group-rank order
  // (the chip clock prices collectives by where they are: Note [Chip clock]).
  ProcessGroupNpu(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size,
      std::chrono::milliseconds timeout, std::string name, std::vector<int> global_ranks);

  const std::string getBackendName() const override {
    return name_;
  }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return options_;
  }
  bool supportsTensorAlloc(c10::DeviceIndex device) override {
    return true;
  }
  // DeviceMesh splits a group whose device is bound (init_process_group with
  // device_id) instead of calling new_group; the inner gloo group splits too.
  bool supportsSplitting() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
      const std::vector<int>& ranks, const c10::intrusive_ptr<Options>& opts) override;
  void setSequenceNumberForGroup() override {
    gloo_->setSequenceNumberForGroup();
  }
  uint64_t getSequenceNumberForGroup() override {
    return gloo_->getSequenceNumberForGroup();
  }
  // Plain device memory: there is no registered comm pool to draw from.
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_split_sizes, std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

 private:
  struct Launch;
  c10::intrusive_ptr<c10d::Work> launch(Launch&& launch);
  std::string describe(const char* op, c10::DeviceIndex device) const;

  const c10::intrusive_ptr<c10d::Backend> gloo_;
  const bool planned_;  // gloo_ is a MirrorBackend: Note [A planned world]
  const c10::intrusive_ptr<NpuOptions> options_;
  const std::string name_;
  const std::vector<int> global_ranks_;
  CommStream comm_;
};

}  // namespace npusim::dist
