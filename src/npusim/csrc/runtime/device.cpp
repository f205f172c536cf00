#include "device.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <atomic>

namespace npusim {

namespace {
// NPUSIM_DEVICE_COUNT or ASCEND_RT_VISIBLE_DEVICES change it (set from Python before first use).
std::atomic<int> g_device_count{kDefaultDeviceCount};
std::atomic<bool> g_devices_in_use{false};
thread_local c10::DeviceIndex tls_current_device = 0;
thread_local bool tls_is_stream_worker = false;
// NPUSIM_LAUNCH_BLOCKING=1 makes every enqueue wait for its task (like
// CUDA_LAUNCH_BLOCKING): a debugging aid for ordering bugs.
std::atomic<bool> g_launch_blocking{false};

// Note [Fork after npu use]
// A forked child has only the forking thread: the parent's stream workers
// are gone, so the first task the child enqueued would wait forever. As
// CUDA and torch_npu do, a child forked after the npu was used is marked,
// and its first device call raises (torch.npu._is_in_bad_fork() says so
// too, which makes torch.manual_seed skip the npu there).
std::atomic<bool> g_in_bad_fork{false};

void mark_forked_child() {
  if (g_devices_in_use.load()) {
    g_in_bad_fork = true;
  }
}

[[maybe_unused]] const int g_fork_handler_installed = pthread_atfork(nullptr, nullptr, &mark_forked_child);

}  // namespace

bool in_bad_fork() {
  return g_in_bad_fork.load(std::memory_order_relaxed);
}

int device_count() {
  return g_device_count.load();
}

void set_device_count(int count) {
  TORCH_CHECK(count >= 1 && count <= kMaxDevices,
      "npusim: device count must be in [1, ", kMaxDevices, "], got ", count);
  TORCH_CHECK(!g_devices_in_use.load() || count == g_device_count.load(),
      "npusim: the device count can only be set before the first npu device is used "
      "(it is ", g_device_count.load(), ")");
  g_device_count = count;
}

void mark_devices_in_use() {
  g_devices_in_use = true;
}

void check_device_index(int64_t index, const char* op) {
  TORCH_CHECK(!in_bad_fork(), op, ": Cannot re-initialize npu in forked subprocess. To use npu "
      "with multiprocessing, you must use the 'spawn' start method");
  TORCH_CHECK(index >= 0 && index < device_count(), op, ": invalid npu device index ",
      index, "; expected 0 <= index < device_count() = ", device_count(),
      index < 0 ? " (torch.device keeps the index in 8 bits: an index above 127 wraps to a "
                  "negative number)" : "");
}

c10::DeviceIndex current_device() {
  return tls_current_device;
}

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index, "set_device");
  tls_current_device = index;
}

void set_launch_blocking(bool blocking) {
  g_launch_blocking = blocking;
}

bool launch_blocking() {
  return g_launch_blocking.load(std::memory_order_relaxed);
}

void enter_stream_worker(c10::DeviceIndex device) {
  tls_is_stream_worker = true;
  tls_current_device = device;
}

bool on_stream_worker() {
  return tls_is_stream_worker;
}

}  // namespace npusim
