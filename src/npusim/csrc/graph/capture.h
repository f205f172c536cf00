// What an npu graph capture holds (graph.cpp): the tasks
// recorded from the captured stream, the private pool its allocations come
// from, and the first forbidden call. See Note [NPU graph capture].
#pragma once

#include "../runtime/device_allocator.h"
#include "../runtime/stream.h"

#include <c10/core/Allocator.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace npusim {

struct GraphTask {
  std::function<void()> fn;
  double duration_us;
  std::string label;  // for debug_dump
};

// A graph's private memory pool (Note [NPU graph memory]): blocks of the
// ordinary device allocator kept alive until the pool goes away.
struct GraphPool final : PrivatePool {
  c10::MempoolId_t id;
  std::mutex mutex;
  std::vector<std::shared_ptr<c10::DataPtr>> blocks;

  c10::DataPtr allocate(c10::DeviceIndex device, size_t nbytes) override;
};

// A capture underway on one stream; the stream hands it its tasks.
struct GraphCapture final : StreamCapture {
  std::mutex mutex;
  std::vector<GraphTask> tasks;
  std::shared_ptr<GraphPool> pool;
  NpuStream* stream = nullptr;
  std::string invalidated;  // the first forbidden call, if any

  void append(GraphTask task);
  // Records `message` as the capture's failure (the first one wins) and raises it.
  [[noreturn]] void invalidate(const std::string& message) override;

  void add_task(std::function<void()> fn, double duration_us, const char* op) override;
  [[noreturn]] void refuse_host_wait(const NpuStream& stream, const char* op) override;
};

}  // namespace npusim
