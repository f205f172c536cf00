#include "work.h"

#include "core_api_client.h"

#include <c10/util/Exception.h>

#include <stdexcept>

namespace npusim::dist {
namespace {

std::exception_ptr backend_error(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

NpuWork::NpuWork(int rank, c10d::OpType op, c10::DeviceIndex device, std::vector<at::Tensor> outputs,
    bool host_blocking, std::string what)
    : c10d::Work(rank, op),
      device_(device),
      outputs_(std::move(outputs)),
      host_blocking_(host_blocking),
      what_(std::move(what)),
      completion_(std::make_shared<Completion>()),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

bool NpuWork::isCompleted() {
  const CoreApi& api = core();
  if (!api.chip_clock_on() || api.realtime_timing()) {
    return completion_->done();
  }
  // In chip time, never in this machine's (Note [Chip clock]).
  completion_->wait(-1.0);
  api.host_query();
  return completion_->chip_us() <= api.host_clock_us();
}

bool NpuWork::isSuccess() const {
  return completion_->error().empty();
}

std::exception_ptr NpuWork::exception() const {
  const std::string error = completion_->error();
  return error.empty() ? nullptr : backend_error(error);
}

std::vector<at::Tensor> NpuWork::result() {
  return outputs_;
}

void NpuWork::throw_if_failed() const {
  const std::string error = completion_->error();
  if (!error.empty()) {
    C10_THROW_ERROR(DistBackendError, error);
  }
}

bool NpuWork::wait(std::chrono::milliseconds timeout) {
  if (host_blocking_ || timeout != kNoTimeout) {
    const double timeout_s = timeout == kNoTimeout ? -1.0 : static_cast<double>(timeout.count()) / 1e3;
    if (!completion_->wait(timeout_s)) {
      C10_THROW_ERROR(DistBackendError,
          c10::str(what_, " did not complete within the wait timeout of ", timeout.count(), " ms"));
    }
    throw_if_failed();
    if (core().chip_clock_on()) {
      core().host_wait_until(completion_->chip_us());  // Note [Chip clock]
    }
    return true;
  }
  throw_if_failed();  // a collective that already failed says so now
  blockCurrentStream();
  return true;
}

void NpuWork::synchronize() {
  blockCurrentStream();
}

void NpuWork::blockCurrentStream() {
  const CoreApi& api = core();
  if (completion_->done()) {
    throw_if_failed();
    if (!api.chip_clock_on()) {
      return;  // under the chip clock it still ends at a chip time the stream must wait for
    }
  }
  // A failure surfaces at the stream's next synchronize, like an
  // asynchronous device error.
  api.enqueue(api.current_stream(device_), [completion = completion_, wait_until = api.task_wait_until] {
    completion->wait(-1.0);
    wait_until(completion->chip_us());  // Note [Chip clock]
    const std::string error = completion->error();
    if (!error.empty()) {
      throw std::runtime_error(error);
    }
  }, "wait_collective", /*wait=*/true);
}

c10::intrusive_ptr<c10::ivalue::Future> NpuWork::getFuture() {
  return future_;
}

std::function<void(const std::string&, double)> NpuWork::completer() const {
  return [completion = completion_](const std::string& error, double chip_us) { completion->set(error, chip_us); };
}

std::function<void(const std::string&)> NpuWork::releaser() const {
  // Marking the future may run Python callbacks and holds the outputs, so it
  // belongs to the release thread (Note [Comm stream]).
  // The outputs are held weakly (Note [Collectives hold no tensors]): the
  // release thread runs when this machine gets to it, so a strong reference
  // here would free them at a time the program does not decide.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> outputs;
  outputs.reserve(outputs_.size());
  for (const at::Tensor& t : outputs_) {
    outputs.emplace_back(t.getIntrusivePtr());
  }
  return [future = future_, outputs = std::move(outputs)](const std::string& error) {
    if (!error.empty()) {
      future->setError(backend_error(error));
      return;
    }
    std::vector<at::Tensor> alive;
    alive.reserve(outputs.size());
    for (const auto& weak : outputs) {
      if (auto impl = weak.lock()) {
        alive.emplace_back(std::move(impl));
      }
    }
    future->markCompleted(c10::IValue(alive));
  };
}

}  // namespace npusim::dist
