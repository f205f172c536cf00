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
  return completion_->done();
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
  if (completion_->done()) {
    throw_if_failed();
    return;
  }
  const CoreApi& api = core();
  // A failure surfaces at the stream's next synchronize, like an
  // asynchronous device error.
  api.enqueue(api.current_stream(device_), [completion = completion_] {
    completion->wait(-1.0);
    const std::string error = completion->error();
    if (!error.empty()) {
      throw std::runtime_error(error);
    }
  }, 0.0);
}

c10::intrusive_ptr<c10::ivalue::Future> NpuWork::getFuture() {
  return future_;
}

std::function<void(const std::string&)> NpuWork::completer() const {
  return [completion = completion_](const std::string& error) { completion->set(error); };
}

std::function<void(const std::string&)> NpuWork::releaser() const {
  // Marking the future may run Python callbacks and holds the outputs, so it
  // belongs to the release thread (Note [Comm stream]).
  return [future = future_, outputs = outputs_](const std::string& error) {
    if (error.empty()) {
      future->markCompleted(c10::IValue(outputs));
    } else {
      future->setError(backend_error(error));
    }
  };
}

}  // namespace npusim::dist
