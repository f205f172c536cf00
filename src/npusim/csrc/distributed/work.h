// The Work returned by the npu collective backend: NCCL-like completion
// semantics over a comm-stream job (see Note [Comm stream]).
#pragma once

#include "comm_stream.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <string>
#include <vector>

namespace npusim::dist {

class NpuWork final : public c10d::Work {
 public:
  // host_blocking: wait() blocks the host (barrier, as NCCL's barrier does).
  NpuWork(int rank, c10d::OpType op, c10::DeviceIndex device, std::vector<at::Tensor> outputs,
      bool host_blocking, std::string what);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Without a timeout: makes the current stream of the work's device wait for
  // the collective and returns at once (the host does not block), as NCCL
  // does. With a timeout, or for a barrier: blocks the host until done and
  // raises DistBackendError on failure or when the timeout passes.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // Both: make the current stream wait for the collective, host does not block.
  void synchronize() override;
  void blockCurrentStream() override;
  // Completes (value: the outputs) when the collective does; not stream-aware,
  // so `future.wait()` blocks the host until then.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // The job's CommJob::complete and CommJob::release. Neither captures the
  // Work: a stream task or comm thread holding it would hold its outputs.
  std::function<void(const std::string&, double chip_us)> completer() const;
  std::function<void(const std::string&)> releaser() const;

 private:
  void throw_if_failed() const;

  const c10::DeviceIndex device_;
  const std::vector<at::Tensor> outputs_;
  const bool host_blocking_;
  const std::string what_;
  const std::shared_ptr<Completion> completion_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace npusim::dist
