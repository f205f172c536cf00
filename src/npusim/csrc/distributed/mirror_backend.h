// The inner group of a planned world's hccl groups: collectives computed as
// if every rank of the group held this rank's data (Note [A planned world],
// backend.cpp).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <vector>

namespace npusim::dist {

// Takes the place of the inner ProcessGroupGloo in a group of a planned
// world: the same calls, on the same CPU views, each done locally and
// returned complete. Where the result would depend on another rank's data,
// that rank is taken to hold this rank's (an SPMD job's ranks hold alike
// data): an all-gather repeats the input, a sum multiplies it by the group's
// size, an all-to-all gives back the chunk this rank would send itself. What
// only another rank holds (a broadcast, a scatter or a recv from a peer)
// leaves the outputs as they are.
//
// It is also the whole of a planned world's CPU groups ("gloo" groups, whose
// peers are not there to rendezvous with): plan/world.py gives it to
// torch.distributed in ProcessGroupGloo's place.
class MirrorBackend final : public c10d::Backend {
 public:
  MirrorBackend(int rank, int size, std::chrono::milliseconds timeout = std::chrono::minutes(30))
      : c10d::Backend(rank, size), options_(c10::make_intrusive<Options>("gloo", timeout)) {}

  const std::string getBackendName() const override {
    return "gloo";
  }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return options_;
  }
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override {
    return 0;
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_split_sizes, std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

 private:
  const c10::intrusive_ptr<Options> options_;
};

}  // namespace npusim::dist
