// The inner group of a planned world: see mirror_backend.h.
#include "mirror_backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace npusim::dist {
namespace {

// A Work that is done when it is made: the mirror computed its result in the call.
class DoneWork final : public c10d::Work {
 public:
  bool isCompleted() override {
    return true;
  }
  bool isSuccess() const override {
    return true;
  }
  bool wait(std::chrono::milliseconds) override {
    return true;
  }
  void synchronize() override {}
};

c10::intrusive_ptr<c10d::Work> done() {
  return c10::make_intrusive<DoneWork>();
}

// `t` reduced with `op` over `copies` ranks that each hold it, in place. AVG and
// PREMUL_SUM never reach here: the npu backend asks for SUM and scales itself.
void reduce_copies(at::Tensor& t, const c10d::ReduceOp& op, int copies) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      if (t.scalar_type() == at::kBool) {
        return;  // a logical or
      }
      t.mul_(copies);
      return;
    case c10d::ReduceOp::PRODUCT:
      if (t.scalar_type() != at::kBool) {
        t.copy_(t.pow(copies));
      }
      return;
    case c10d::ReduceOp::BXOR:
      if (copies % 2 == 0) {
        t.zero_();
      }
      return;
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
      return;
    default:
      TORCH_CHECK(false, "npusim planned world: reduce op ", static_cast<int>(op.op_), " is not supported");
  }
}

// The `index`-th of `parts` equal chunks of a flat tensor.
at::Tensor chunk_of(const at::Tensor& flat, int parts, int index) {
  const int64_t n = flat.numel() / parts;
  return flat.view({-1}).narrow(0, n * index, n);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> MirrorBackend::broadcast(std::vector<at::Tensor>&, const c10d::BroadcastOptions&) {
  return done();  // the root's data, which this rank holds when it is the root and does not know otherwise
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::allreduce(std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  for (at::Tensor& t : tensors) {
    reduce_copies(t, opts.reduceOp, size_);
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  for (at::Tensor& t : tensors) {
    reduce_copies(t, opts.reduceOp, size_);
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  return allgather(outputs, inputs, opts);  // output list k holds input k from every rank
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  for (size_t k = 0; k < outputs.size() && k < inputs.size(); ++k) {
    _allgather_base(outputs[k], inputs[k], opts);
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  for (size_t k = 0; k < outputs.size() && k < inputs.size(); ++k) {
    _reduce_scatter_base(outputs[k], inputs[k], opts);
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  if (rank_ == opts.rootRank) {
    for (at::Tensor& t : tensors) {
      reduce_copies(t, opts.reduceOp, size_);
    }
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  for (size_t k = 0; k < inputs.size() && k < outputs.size(); ++k) {
    for (at::Tensor& out : outputs[k]) {
      out.copy_(inputs[k]);
    }
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
    const c10d::AllgatherOptions&) {
  for (int j = 0; j < size_; ++j) {
    chunk_of(output, size_, j).copy_(input.view({-1}));
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  if (rank_ == opts.rootRank && !outputs.empty() && !inputs.empty()) {
    for (at::Tensor& out : outputs[0]) {
      out.copy_(inputs[0]);
    }
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::scatter(std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts) {
  if (rank_ == opts.rootRank && !outputs.empty() && !inputs.empty()) {
    outputs[0].copy_(inputs[0][static_cast<size_t>(rank_)]);
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs, const c10d::ReduceScatterOptions& opts) {
  for (size_t k = 0; k < outputs.size() && k < inputs.size(); ++k) {
    outputs[k].copy_(inputs[k][static_cast<size_t>(rank_)]);
    reduce_copies(outputs[k], opts.reduceOp, size_);
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  output.view({-1}).copy_(chunk_of(input, size_, rank_));
  reduce_copies(output, opts.reduceOp, size_);
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
    std::vector<int64_t>& output_split_sizes, std::vector<int64_t>& input_split_sizes,
    const c10d::AllToAllOptions&) {
  // Rank j sends this rank its chunk for this rank; taken to be this rank's own chunk for itself.
  const auto split = [&](const at::Tensor& t, const std::vector<int64_t>& sizes, int j) {
    if (sizes.empty()) {
      const int64_t rows = t.size(0) / size_;
      return t.narrow(0, rows * j, rows);
    }
    int64_t start = 0;
    for (int i = 0; i < j; ++i) {
      start += sizes[static_cast<size_t>(i)];
    }
    return t.narrow(0, start, sizes[static_cast<size_t>(j)]);
  };
  const at::Tensor own = split(input, input_split_sizes, rank_);
  for (int j = 0; j < size_; ++j) {
    at::Tensor slot = split(output, output_split_sizes, j);
    const int64_t rows = std::min(slot.size(0), own.size(0));
    slot.narrow(0, 0, rows).copy_(own.narrow(0, 0, rows));
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::alltoall(std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllToAllOptions&) {
  for (at::Tensor& out : outputs) {
    out.copy_(inputs[static_cast<size_t>(rank_)]);
  }
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::send(std::vector<at::Tensor>&, int, int) {
  return done();
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::recv(std::vector<at::Tensor>&, int, int) {
  return done();  // the peer's data is not known: the buffer stays as it is
}

c10::intrusive_ptr<c10d::Work> MirrorBackend::barrier(const c10d::BarrierOptions&) {
  return done();
}

}  // namespace npusim::dist
