#include "backend.h"

#include "core_api_client.h"
#include "mirror_backend.h"
#include "../runtime/npu_type.h"
#include "work.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace npusim::dist {
namespace {

using TensorList = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;
size_t nbytes(const TensorList& tensors) {
  size_t n = 0;
  for (const auto& t : tensors) {
    n += static_cast<size_t>(t.numel()) * t.element_size();
  }
  return n;
}

size_t nbytes(const TensorLists& lists) {
  size_t n = 0;
  for (const auto& l : lists) {
    n += nbytes(l);
  }
  return n;
}

// Checks that every tensor is a dense npu tensor on `device` (the first
// tensor's device when -1) and returns that device.
c10::DeviceIndex check_tensors(const std::string& op, const TensorList& tensors, c10::DeviceIndex device = -1) {
  for (const auto& t : tensors) {
    TORCH_CHECK(t.defined(), op, ": expected defined tensors, got an undefined one");
    TORCH_CHECK(t.device().type() == kNpu, op, ": expected npu tensors, got a tensor on ", t.device(),
        " (use a gloo group for CPU tensors)");
    TORCH_CHECK(device < 0 || t.device().index() == device, op, ": expected every tensor on npu:",
        static_cast<int>(device), ", got one on ", t.device());
    TORCH_CHECK(t.is_contiguous(t.suggest_memory_format()), op,
        ": expected contiguous tensors, got sizes ", t.sizes(), " strides ", t.strides());
    device = t.device().index();
  }
  return device;
}

c10::DeviceIndex check_tensors(const std::string& op, const TensorLists& lists, c10::DeviceIndex device) {
  for (const auto& l : lists) {
    device = check_tensors(op, l, device);
  }
  return device;
}

at::Tensor cpu_view(const at::Tensor& t) {
  return core().cpu_alias(t);
}

// gloo's *_base collectives want 1-D buffers; NCCL accepts any shape with
// the right element count (e.g. all_gather_into_tensor into [world, n]).
at::Tensor flat_alias(const at::Tensor& t) {
  return cpu_view(t).view({-1});
}

TensorList cpu_views(const TensorList& tensors) {
  TensorList out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    out.push_back(cpu_view(t));
  }
  return out;
}

TensorLists cpu_views(const TensorLists& lists) {
  TensorLists out;
  out.reserve(lists.size());
  for (const auto& l : lists) {
    out.push_back(cpu_views(l));
  }
  return out;
}

// A reduce op as gloo runs it: gloo has neither AVG nor PREMUL_SUM, so AVG is
// SUM then a division by the group size and PREMUL_SUM scales the inputs
// (into new buffers: the caller's inputs stay untouched) then sums.
struct Reduction {
  c10d::ReduceOp gloo_op{c10d::ReduceOp::SUM};
  bool average = false;
  bool premul = false;
  double factor = 1.0;
  at::Tensor factor_tensor;  // CPU (alias), read when the collective runs

  double scale() const {
    return factor_tensor.defined() ? factor_tensor.item<double>() : factor;
  }
  at::Tensor scaled(const at::Tensor& t) const {
    return premul ? t.mul(scale()) : t;
  }
  TensorList scaled(const TensorList& tensors) const {
    if (!premul) {
      return tensors;
    }
    TensorList out;
    for (const auto& t : tensors) {
      out.push_back(scaled(t));
    }
    return out;
  }
  void finish(const TensorList& outputs, int size) const {
    if (!average) {
      return;
    }
    for (const auto& t : outputs) {
      if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
        t.div_(size, "trunc");
      } else {
        t.div_(size);
      }
    }
  }
};

Reduction make_reduction(const std::string& op, const c10d::ReduceOp& reduce_op) {
  Reduction r;
  switch (reduce_op.op_) {
    case c10d::ReduceOp::AVG:
      r.average = true;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(reduce_op.supplement_, op, ": PREMUL_SUM without a factor");
      // PREMUL_SUM always carries this supplement (c10d::makePreMulSum).
      const auto* s = static_cast<const c10d::PreMulSumSupplement*>(reduce_op.supplement_.get());
      r.premul = true;
      r.factor = s->double_factor;
      if (s->tensor_factor.defined()) {
        r.factor_tensor = s->tensor_factor.device().type() == kNpu ? cpu_view(s->tensor_factor) : s->tensor_factor;
      }
      break;
    }
    case c10d::ReduceOp::UNUSED:
      TORCH_CHECK(false, op, ": invalid reduce op UNUSED");
    default:
      r.gloo_op = c10d::ReduceOp(reduce_op.op_);
  }
  return r;
}

template <typename Opts>
Opts with_op(const Opts& opts, const Reduction& r) {
  Opts out = opts;
  out.reduceOp = r.gloo_op;
  return out;
}

}  // namespace

struct ProcessGroupNpu::Launch {
  c10d::OpType type;
  const char* op;  // torch.distributed's name, for messages
  c10::DeviceIndex device;
  TensorList outputs;  // Work::result()
  size_t bytes = 0;    // moved over the link, for the timing model
  std::function<void()> run;
  std::function<c10::intrusive_ptr<c10d::Work>()> post;
  bool host_blocking = false;
  int peer = -1;  // point-to-point: the other rank (group rank), which the chip clock prices the link to
};

ProcessGroupNpu::ProcessGroupNpu(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size,
    std::chrono::milliseconds timeout, std::string name, std::vector<int> global_ranks)
    : c10d::Backend(rank, size),
      gloo_(std::move(gloo)),
      planned_(dynamic_cast<const MirrorBackend*>(gloo_.get()) != nullptr),
      options_(c10::make_intrusive<NpuOptions>(name, timeout)),
      name_(std::move(name)),
      global_ranks_(std::move(global_ranks)) {
  TORCH_CHECK(static_cast<int>(global_ranks_.size()) == size, name_, ": expected ", size,
      " global ranks for a group of ", size, ", got ", global_ranks_.size());
  init();
}

std::string ProcessGroupNpu::describe(const char* op, c10::DeviceIndex device) const {
  return c10::str(name_, " ", op, " on npu:", static_cast<int>(device), " (rank ", rank_, " of ", size_, ")");
}

// Note [A planned world]
// `npusim plan --world-size N` runs one rank of an SPMD job alone (Note [Plan
// mode] in runtime/plan_mode.cpp): the other N-1 ranks are not processes, so
// a collective has no one to move data with. It is launched and priced as in a world that computes (the
// collective waits for its inputs on the current stream, takes the
// algorithm's chip time for the group's size and the ranks' placement on
// nodes, completes its Work and frees in stream order). Its data follows
// plan mode's rule (Note [Plan mode]): a collective over more than 1 MiB
// moves nothing; a smaller one is computed by a MirrorBackend, which stands
// in for the inner gloo group and takes every other rank to hold this rank's
// data, as an SPMD job's ranks do: an all-gather repeats this rank's input,
// a sum is the group's size times it, a max is itself. So the small
// exchanges a job's control flow depends on (all_gather_object,
// gather_object and the planning of torch.distributed.checkpoint, a
// found-inf flag, the sizes of an all-to-all) give what they give when every
// rank is alike; what only another rank holds (a broadcast or a scatter from
// another root, a recv) leaves the outputs as they are. The start of a
// collective is this rank's alone: with the ranks of an SPMD job in step,
// the latest rank's inputs are ready when this one's are. Subgroups
// (new_group, split_group, DeviceMesh) are planned groups of the same world.
c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::launch(Launch&& l) {
  const CoreApi& api = core();
  if (!l.post && !api.work_runs(l.bytes)) {
    // Note [Plan mode]: the ranks still agree on the start; a large
    // collective's data (zeros) is not moved. A point-to-point transfer still
    // moves its bytes: its completion is the peer's send, which the chip
    // clock needs.
    l.run = [] {};
  }
  RECORD_FUNCTION(c10::str("npusim::hccl:", l.op), std::vector<c10::IValue>());
  const std::string what = describe(l.op, l.device);
  auto work = c10::make_intrusive<NpuWork>(rank_, l.type, l.device, l.outputs, l.host_blocking, what);
  CommJob job;
  // The collective may only start once the work issued before it on the
  // current stream has run: that work may still be producing its inputs.
  // Under the chip clock that is also the chip time its inputs are ready.
  NpuStream* stream = api.current_stream(l.device);
  const bool on_chip_clock = api.chip_clock_on();
  if (!api.stream_query(stream) || on_chip_clock) {
    auto ready = std::make_shared<Completion>();
    api.enqueue(stream, [ready, now = api.task_or_host_now] { ready->set({}, now()); }, "collective_inputs",
        /*wait=*/false);
    job.inputs_ready = std::move(ready);
  }
  if (on_chip_clock) {
    // Note [Chip clock]: a launch; the duration is the algorithm's over the group's links.
    job.issue_us = api.host_launch();
    TORCH_CHECK(l.peer < size_, what, ": peer rank ", l.peer, " is not in the group of ", size_);
    job.duration_us = api.collective_us(l.op, l.bytes,
        l.peer >= 0 ? std::vector<int>{global_ranks_[rank_], global_ranks_[l.peer]} : global_ranks_);
    if (!l.post && l.peer < 0 && size_ > 1 && !planned_) {
      job.agree_start = [gloo = gloo_](double ready_us) {
        std::vector<at::Tensor> latest{at::full({1}, ready_us, at::kDouble)};
        c10d::AllreduceOptions max;
        max.reduceOp = c10d::ReduceOp::MAX;
        gloo->allreduce(latest, max)->wait();
        return latest[0].item<double>();
      };
    }
  } else {
    job.duration_us = l.bytes > 0 ? api.link_task_us(l.bytes) : 0.0;
  }
  // Note [Collectives write as a device does]
  // gloo runs the collective on the comm stream's thread over CPU aliases of
  // the npu tensors, and some of its ops write the outputs with ATen ops
  // (all_gather_into_tensor copies into its output). Under the issuing
  // thread's torch.inference_mode the tensors are inference tensors, and an
  // in-place ATen op on one outside inference mode raises ("Inplace update to
  // inference tensor outside InferenceMode"), so a collective under
  // inference mode failed on 2 ranks. A collective's writes are a device's
  // (NCCL's and HCCL's kernels write memory; autograd sees nothing), so the
  // comm thread runs them below autograd and ADInplaceOrView: no
  // inference-tensor check, no version bump on the aliases, whatever mode
  // the issuing thread was in.
  if (l.post) {
    job.post = [post = std::move(l.post)] {
      const at::AutoDispatchBelowADInplaceOrView device_writes;
      return post();
    };
  } else {
    job.run = [run = std::move(l.run)] {
      const at::AutoDispatchBelowADInplaceOrView device_writes;
      run();
    };
  }
  job.complete = work->completer();
  job.release = work->releaser();
  job.what = what;
  if (profiler_active()) {
    job.profile = api.profile_collective(c10::str("hccl ", what), l.device, job.duration_us);
  }
  comm_.submit(std::move(job));
  return work;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupNpu::split(const c10::intrusive_ptr<c10d::Store>& store,
    const std::vector<int>& ranks, const c10::intrusive_ptr<Options>& opts) {
  const auto timeout = opts ? opts->timeout : options_->timeout;
  if (planned_) {  // Note [A planned world]: a planned child of the same world
    const auto self = std::find(ranks.begin(), ranks.end(), global_ranks_[rank_]);
    if (self == ranks.end()) {
      return nullptr;
    }
    const int child_rank = static_cast<int>(self - ranks.begin());
    const int child_size = static_cast<int>(ranks.size());
    auto child = c10::make_intrusive<ProcessGroupNpu>(c10::make_intrusive<MirrorBackend>(child_rank, child_size),
        child_rank, child_size, timeout, name_, std::vector<int>(ranks.begin(), ranks.end()));
    child->setBoundDeviceId(getBoundDeviceId());
    return child;
  }
  // gloo's split reads its own options type: give it the inner group's.
  auto gloo = gloo_->split(store, ranks, gloo_->getBackendOptions());
  if (!gloo) {
    return nullptr;  // this rank is not in `ranks`
  }
  gloo->setTimeout(timeout);
  std::vector<int> child_ranks(ranks.begin(), ranks.end());  // split_group's ranks are global ones
  auto child = c10::make_intrusive<ProcessGroupNpu>(gloo, gloo->getRank(), gloo->getSize(), timeout, name_,
      std::move(child_ranks));
  child->setBoundDeviceId(getBoundDeviceId());
  return child;
}

at::Tensor ProcessGroupNpu::allocateTensor(long size, at::TensorOptions options) {
  return at::empty({size}, options);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::broadcast(TensorList& tensors, const c10d::BroadcastOptions& opts) {
  const auto device = check_tensors(name_ + " broadcast", tensors);
  return launch({c10d::OpType::BROADCAST, "broadcast", device, tensors, nbytes(tensors),
      [gloo = gloo_, a = cpu_views(tensors), opts]() mutable { gloo->broadcast(a, opts)->wait(); }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::allreduce(TensorList& tensors, const c10d::AllreduceOptions& opts) {
  const auto device = check_tensors(name_ + " all_reduce", tensors);
  Reduction r = make_reduction(name_ + " all_reduce", opts.reduceOp);
  return launch({c10d::OpType::ALLREDUCE, "all_reduce", device, tensors, nbytes(tensors),
      [gloo = gloo_, a = cpu_views(tensors), r, opts = with_op(opts, r), size = size_]() mutable {
        for (auto& t : a) {
          if (r.premul) {
            t.mul_(r.scale());  // in place: the result overwrites it anyway
          }
        }
        gloo->allreduce(a, opts)->wait();
        r.finish(a, size);
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::allreduce_coalesced(
    TensorList& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const auto device = check_tensors(name_ + " all_reduce_coalesced", tensors);
  Reduction r = make_reduction(name_ + " all_reduce_coalesced", opts.reduceOp);
  c10d::AllreduceOptions one;
  one.reduceOp = r.gloo_op;
  one.timeout = opts.timeout;
  return launch({c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", device, tensors, nbytes(tensors),
      [gloo = gloo_, a = cpu_views(tensors), r, one, size = size_]() mutable {
        for (auto& t : a) {
          if (r.premul) {
            t.mul_(r.scale());
          }
          TensorList single{t};
          gloo->allreduce(single, one)->wait();
        }
        r.finish(a, size);
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::reduce(TensorList& tensors, const c10d::ReduceOptions& opts) {
  const auto device = check_tensors(name_ + " reduce", tensors);
  Reduction r = make_reduction(name_ + " reduce", opts.reduceOp);
  return launch({c10d::OpType::REDUCE, "reduce", device, tensors, nbytes(tensors),
      [gloo = gloo_, a = cpu_views(tensors), r, opts = with_op(opts, r), rank = rank_, size = size_]() mutable {
        TensorList buffers = r.scaled(a);
        gloo->reduce(buffers, opts)->wait();
        if (rank == opts.rootRank) {
          for (size_t i = 0; r.premul && i < a.size(); ++i) {
            a[i].copy_(buffers[i]);
          }
          r.finish(a, size);
        }
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::allgather(
    TensorLists& outputs, TensorList& inputs, const c10d::AllgatherOptions& opts) {
  const std::string op = name_ + " all_gather";
  const auto device = check_tensors(op, outputs, check_tensors(op, inputs));
  return launch({c10d::OpType::ALLGATHER, "all_gather", device, outputs.empty() ? TensorList{} : outputs[0],
      nbytes(outputs), [gloo = gloo_, o = cpu_views(outputs), i = cpu_views(inputs), opts]() mutable {
        gloo->allgather(o, i, opts)->wait();
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const std::string op = name_ + " all_gather_into_tensor";
  const auto device = check_tensors(op, {output}, check_tensors(op, {input}));
  TORCH_CHECK(output.numel() == input.numel() * size_, op, ": output has ", output.numel(),
      " elements, expected world size (", size_, ") x input (", input.numel(), ")");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), op, ": output dtype ", output.scalar_type(),
      " differs from input dtype ", input.scalar_type());
  return launch({c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", device, {output},
      nbytes({output}), [gloo = gloo_, o = flat_alias(output), i = flat_alias(input), opts]() mutable {
        gloo->_allgather_base(o, i, opts)->wait();
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::allgather_coalesced(
    TensorLists& outputs, TensorList& inputs, const c10d::AllgatherOptions& opts) {
  const std::string op = name_ + " all_gather_coalesced";
  const auto device = check_tensors(op, outputs, check_tensors(op, inputs));
  TORCH_CHECK(outputs.size() == inputs.size(), op, ": expected one output list per input, got ",
      outputs.size(), " lists for ", inputs.size(), " inputs");
  TensorList flat_outputs;
  for (const auto& l : outputs) {
    flat_outputs.insert(flat_outputs.end(), l.begin(), l.end());
  }
  return launch({c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced", device, flat_outputs, nbytes(outputs),
      [gloo = gloo_, o = cpu_views(outputs), i = cpu_views(inputs), opts]() mutable {
        for (size_t k = 0; k < i.size(); ++k) {
          TensorLists out{o[k]};
          TensorList in{i[k]};
          gloo->allgather(out, in, opts)->wait();
        }
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::allgather_into_tensor_coalesced(
    TensorList& outputs, TensorList& inputs, const c10d::AllgatherOptions& opts) {
  const std::string op = name_ + " all_gather_into_tensor_coalesced";
  const auto device = check_tensors(op, outputs, check_tensors(op, inputs));
  TORCH_CHECK(outputs.size() == inputs.size(), op, ": got ", outputs.size(), " outputs for ", inputs.size(), " inputs");
  TensorList o;
  TensorList i;
  for (size_t k = 0; k < inputs.size(); ++k) {
    TORCH_CHECK(outputs[k].numel() == inputs[k].numel() * size_, op, ": output ", k, " has ",
        outputs[k].numel(), " elements, expected world size (", size_, ") x input (", inputs[k].numel(), ")");
    o.push_back(flat_alias(outputs[k]));
    i.push_back(flat_alias(inputs[k]));
  }
  return launch({c10d::OpType::COALESCED, "all_gather_into_tensor_coalesced", device, outputs, nbytes(outputs),
      [gloo = gloo_, o, i, opts]() mutable {
        for (size_t k = 0; k < i.size(); ++k) {
          gloo->_allgather_base(o[k], i[k], opts)->wait();
        }
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::gather(
    TensorLists& outputs, TensorList& inputs, const c10d::GatherOptions& opts) {
  const std::string op = name_ + " gather";
  const auto device = check_tensors(op, outputs, check_tensors(op, inputs));
  return launch({c10d::OpType::GATHER, "gather", device, outputs.empty() ? TensorList{} : outputs[0],
      nbytes(inputs), [gloo = gloo_, o = cpu_views(outputs), i = cpu_views(inputs), opts]() mutable {
        gloo->gather(o, i, opts)->wait();
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::scatter(
    TensorList& outputs, TensorLists& inputs, const c10d::ScatterOptions& opts) {
  const std::string op = name_ + " scatter";
  const auto device = check_tensors(op, inputs, check_tensors(op, outputs));
  return launch({c10d::OpType::SCATTER, "scatter", device, outputs, nbytes(outputs),
      [gloo = gloo_, o = cpu_views(outputs), i = cpu_views(inputs), opts]() mutable {
        gloo->scatter(o, i, opts)->wait();
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::reduce_scatter(
    TensorList& outputs, TensorLists& inputs, const c10d::ReduceScatterOptions& opts) {
  const std::string op = name_ + " reduce_scatter";
  const auto device = check_tensors(op, inputs, check_tensors(op, outputs));
  Reduction r = make_reduction(op, opts.reduceOp);
  return launch({c10d::OpType::REDUCE_SCATTER, "reduce_scatter", device, outputs, nbytes(inputs),
      [gloo = gloo_, o = cpu_views(outputs), i = cpu_views(inputs), r, opts = with_op(opts, r), size = size_]() mutable {
        TensorLists buffers;
        for (const auto& l : i) {
          buffers.push_back(r.scaled(l));
        }
        gloo->reduce_scatter(o, buffers, opts)->wait();
        r.finish(o, size);
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const std::string op = name_ + " reduce_scatter_tensor";
  const auto device = check_tensors(op, {output}, check_tensors(op, {input}));
  TORCH_CHECK(input.numel() == output.numel() * size_, op, ": input has ", input.numel(),
      " elements, expected world size (", size_, ") x output (", output.numel(), ")");
  Reduction r = make_reduction(op, opts.reduceOp);
  return launch({c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", device, {output},
      nbytes({input}), [gloo = gloo_, o = flat_alias(output), i = flat_alias(input), r, opts = with_op(opts, r),
                           size = size_]() mutable {
        at::Tensor buffer = r.scaled(i);
        gloo->_reduce_scatter_base(o, buffer, opts)->wait();
        r.finish({o}, size);
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::reduce_scatter_tensor_coalesced(
    TensorList& outputs, TensorList& inputs, const c10d::ReduceScatterOptions& opts) {
  const std::string op = name_ + " reduce_scatter_tensor_coalesced";
  const auto device = check_tensors(op, outputs, check_tensors(op, inputs));
  TORCH_CHECK(outputs.size() == inputs.size(), op, ": got ", outputs.size(), " outputs for ", inputs.size(), " inputs");
  Reduction r = make_reduction(op, opts.reduceOp);
  TensorList o;
  TensorList i;
  for (size_t k = 0; k < inputs.size(); ++k) {
    TORCH_CHECK(inputs[k].numel() == outputs[k].numel() * size_, op, ": input ", k, " has ", inputs[k].numel(),
        " elements, expected world size (", size_, ") x output (", outputs[k].numel(), ")");
    o.push_back(flat_alias(outputs[k]));
    i.push_back(flat_alias(inputs[k]));
  }
  return launch({c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, "reduce_scatter_tensor_coalesced", device, outputs,
      nbytes(inputs), [gloo = gloo_, o, i, r, opts = with_op(opts, r), size = size_]() mutable {
        for (size_t k = 0; k < i.size(); ++k) {
          at::Tensor buffer = r.scaled(i[k]);
          gloo->_reduce_scatter_base(o[k], buffer, opts)->wait();
        }
        r.finish(o, size);
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::alltoall_base(at::Tensor& output, at::Tensor& input,
    std::vector<int64_t>& output_split_sizes, std::vector<int64_t>& input_split_sizes,
    const c10d::AllToAllOptions& opts) {
  const std::string op = name_ + " all_to_all_single";
  const auto device = check_tensors(op, {output}, check_tensors(op, {input}));
  return launch({c10d::OpType::ALLTOALL_BASE, "all_to_all_single", device, {output},
      nbytes({input}), [gloo = gloo_, o = cpu_view(output), i = cpu_view(input), os = output_split_sizes,
                           is = input_split_sizes, opts]() mutable {
        gloo->alltoall_base(o, i, os, is, opts)->wait();
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::alltoall(
    TensorList& outputs, TensorList& inputs, const c10d::AllToAllOptions& opts) {
  const std::string op = name_ + " all_to_all";
  const auto device = check_tensors(op, outputs, check_tensors(op, inputs));
  return launch({c10d::OpType::ALLTOALL, "all_to_all", device, outputs, nbytes(inputs),
      [gloo = gloo_, o = cpu_views(outputs), i = cpu_views(inputs), opts]() mutable {
        gloo->alltoall(o, i, opts)->wait();
      }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::send(TensorList& tensors, int dst_rank, int tag) {
  const auto device = check_tensors(name_ + " send", tensors);
  Launch l{c10d::OpType::SEND, "send", device, {}, nbytes(tensors)};
  l.post = [gloo = gloo_, a = cpu_views(tensors), dst_rank, tag]() mutable { return gloo->send(a, dst_rank, tag); };
  l.peer = dst_rank;
  return launch(std::move(l));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::recv(TensorList& tensors, int src_rank, int tag) {
  const auto device = check_tensors(name_ + " recv", tensors);
  Launch l{c10d::OpType::RECV, "recv", device, tensors, nbytes(tensors)};
  l.post = [gloo = gloo_, a = cpu_views(tensors), src_rank, tag]() mutable { return gloo->recv(a, src_rank, tag); };
  l.peer = src_rank;
  return launch(std::move(l));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNpu::barrier(const c10d::BarrierOptions& opts) {
  // The device whose current stream the barrier is ordered after, as NCCL
  // picks it: explicit device, then device_ids, then the bound device.
  c10::DeviceIndex device = core().current_device();
  if (opts.device && opts.device->type() == kNpu && opts.device->has_index()) {
    device = opts.device->index();
  } else if (!opts.device_ids.empty()) {
    device = static_cast<c10::DeviceIndex>(opts.device_ids[0]);
  } else if (auto bound = getBoundDeviceId(); bound && bound->type() == kNpu) {
    device = bound->index();
  }
  c10d::BarrierOptions gloo_opts;
  gloo_opts.timeout = opts.timeout;
  Launch l{c10d::OpType::BARRIER, "barrier", device, {}, 0,
      [gloo = gloo_, gloo_opts] { gloo->barrier(gloo_opts)->wait(); }};
  l.host_blocking = true;  // NCCL's barrier blocks the host in wait()
  return launch(std::move(l));
}

}  // namespace npusim::dist
