// The device-core entry points that separately built extensions call.
//
// Python loads extensions with RTLD_LOCAL, so another extension (the
// collective backend, npusim_dist_C) cannot resolve symbols of npusim_C, and
// compiling the runtime floor into it again would create a second, disconnected
// runtime (its own streams, allocator and deferred frees). The core hands out
// this table instead, in a PyCapsule named kCoreApiCapsule from
// `npusim._C.core_api()`. Both extensions are compiled by npusim._build with
// the same compiler and torch headers, so C++ types in the signatures are
// safe; `version` and `size` catch an extension built against another core.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace npusim {

class NpuStream;
struct FenceCounter;
struct TaskProfile;

constexpr uint32_t kCoreApiVersion = 6;
constexpr const char* kCoreApiCapsule = "npusim.core_api";

struct CoreApi {
  uint32_t version;
  uint32_t size;  // sizeof(CoreApi) in the core that filled the table
  // The calling thread's current npu device.
  c10::DeviceIndex (*current_device)();
  // The calling thread's current stream of `device` (-1: current device).
  NpuStream* (*current_stream)(c10::DeviceIndex device);
  // As NpuStream::enqueue: fn runs on the stream's worker, in FIFO order; an
  // exception it throws is reported at the stream's next synchronize. `wait`:
  // the stream waits for a collective (skipped once the device failed);
  // otherwise a signal to a comm stream (runs whatever happened).
  void (*enqueue)(NpuStream* stream, std::function<void()> fn, const char* op, bool wait);
  // True when every task enqueued on the stream so far has completed; raises
  // while an npu graph captures the stream (collectives cannot be captured).
  bool (*stream_query)(NpuStream* stream);
  // See host_transfer.h.
  at::Tensor (*cpu_alias)(const at::Tensor& t);
  // Link time of a transfer of `bytes` under the timing model (0 when off).
  double (*link_task_us)(size_t bytes);
  // A counter of issued / finished work that device-memory frees wait for
  // (see stream.h), and the call that releases frees whose fences passed.
  FenceCounter* (*new_fence_counter)();
  void (*maybe_reclaim)();
  // The interrupt check of host waits (Note [Interruptible host waits] in host_wait.h).
  void (*host_wait_interrupt)();
  // See trace.h: a collective's profile at issue (null unless profiled) and
  // its run on the comm stream as a device activity of `device`'s comm row.
  std::shared_ptr<TaskProfile> (*profile_collective)(std::string name, c10::DeviceIndex device, double modelled_us);
  void (*run_profiled)(TaskProfile& profile, const std::function<void()>& fn);
  // The chip clock (chip_clock.h, Note [Chip clock]).
  bool (*chip_clock_on)();
  bool (*realtime_timing)();
  double (*host_launch)();
  void (*host_wait_until)(double chip_us);
  void (*host_query)();
  double (*host_clock_us)();
  void (*task_wait_until)(double chip_us);
  double (*task_or_host_now)();
  void (*note_task_span)(double start_us, double end_us);
  // A collective's chip time: `op` (torch.distributed's name) moving `bytes`
  // among the group's global ranks (the timing model's collective cost).
  double (*collective_us)(const std::string& op, size_t bytes, const std::vector<int>& ranks);
  // Whether work over `bytes` of device memory runs (plan_mode.h, Note [Plan mode]).
  bool (*work_runs)(size_t bytes);
};

}  // namespace npusim
