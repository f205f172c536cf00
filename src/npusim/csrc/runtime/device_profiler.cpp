#include "device_profiler.h"

#include "device.h"
#include "event.h"
#include "stream.h"
#include "trace.h"

#include <c10/util/StringUtil.h>
#include <kineto/libkineto.h>
#include <kineto/output_base.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace npusim {

// Note [Device tasks in torch.profiler]
// torch 2.13 lets a PrivateUse1 backend into both of its profilers through
// extension points, and the npu uses them as CUDA's CUPTI and CUDA events are
// used, with PyTorch unpatched:
//
// - torch.profiler (kineto): a child activity profiler, registered with
//   libkineto::api().registerProfilerFactory as vendor plugins register
//   theirs. When PrivateUse1 activities are asked for (activities=[...,
//   ProfilerActivity.PrivateUse1], or autograd's profile(use_device="npu",
//   use_kineto=True)) kineto configures a session of it and, as each op's
//   range begins and ends on any thread, pushes and pops the op's correlation
//   id to it (CUPTI's external correlation). A stream task enqueued while the
//   session records takes its launching thread's innermost op
//   (trace.h: profile_task); the stream worker times the task, its modelled
//   duration included (stream.cpp: run_task), and hands it to the session,
//   which makes it a kineto activity: a kernel, a memcpy (copies) or a sync
//   (event records and waits) with pid = its device and tid = its stream
//   (a collective backend's work on the row after the streams), linked to the
//   launching op's CPU activity (getLinkedActivity), its "modelled us"
//   argument the timing model's part of its duration. torch's post-processing
//   then counts it as that op's device time (key_averages' "Self NPU" and
//   "NPU total"), and the Chrome trace shows one row per stream, named after
//   it ("npu:0 stream 3").
// - the legacy profiler (torch.autograd.profiler.profile(use_device="npu"),
//   state KINETO_PRIVATEUSE1_FALLBACK): its stubs (registerPrivateUse1Methods)
//   record an event on the current stream as each op begins and ends and ask
//   for the time between, as CUDA events give it: when the stream reached the
//   op's end minus when it reached its start. The event records are invisible
//   to every observer (event.cpp: event_record_unobserved). Without stubs,
//   torch's default ones raise at every op, so every op ends before it starts
//   and RecordFunction warns of an internal assert.
//
// Nothing is recorded unless a session records: a task then costs one load.
// The worker runs a profiled task under the launching thread's profiler state
// but not its RecordFunction callbacks, so the task's allocations and frees
// are the profiler's memory events while the ops a task runs inside do not
// appear as CPU ops of the worker (a CUDA kernel's inner work does not either).

namespace {

using libkineto::ActivityType;

libkineto::ActivityType kineto_type(ActivityKind kind) {
  switch (kind) {
    case ActivityKind::kMemcpy:
      return ActivityType::GPU_MEMCPY;
    case ActivityKind::kSync:
      return ActivityType::CUDA_SYNC;
    case ActivityKind::kKernel:
      break;
  }
  return ActivityType::CONCURRENT_KERNEL;
}

std::string lane_name(int device, int lane) {
  if (lane == kCommLane) {
    return c10::str("npu:", device, " collectives");
  }
  return c10::str("npu:", device, " stream ", lane, lane == 0 ? " (default)" : "");
}

// One recording of device activities, from start() to processTrace().
class NpuProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    start_device_activities();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    activities_ = stop_device_activities();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override {
    return {};
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked_activity,
      int64_t start_time, int64_t end_time) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_time, end_time, "npu");
    buffer_->gpuOpCount = static_cast<int>(activities_.size());
    std::set<std::pair<int, int>> rows;
    for (DeviceActivity& a : activities_) {
      buffer_->emplace_activity(buffer_->span, kineto_type(a.kind), a.name);
      libkineto::GenericTraceActivity& act = *buffer_->activities.back();
      act.device = a.device;
      act.resource = a.lane;
      act.id = static_cast<int32_t>(a.correlation);
      act.startTime = a.start_ns;
      act.endTime = std::max(a.end_ns, a.start_ns);
      if (linked_activity && a.correlation != 0) {
        act.linked = linked_activity(static_cast<int32_t>(a.correlation));
      }
      act.addMetadataQuoted("stream", lane_name(a.device, a.lane));
      if (a.modelled_us > 0) {
        act.addMetadataQuoted("modelled us", c10::str(a.modelled_us));  // the timing model's part
      }
      act.log(logger);
      rows.emplace(a.device, a.lane);
    }
    activities_.clear();
    for (const auto& [device, lane] : rows) {
      if (devices_.empty() || devices_.back() != device) {
        devices_.push_back(device);
      }
      resources_.push_back(libkineto::ResourceInfo{lane, lane, device, lane_name(device, lane)});
    }
    // kineto takes one device from getDeviceInfo (after this call); the others go to the logger here.
    for (size_t i = 1; i < devices_.size(); ++i) {
      logger.handleDeviceInfo(*device_info(devices_[i]), start_time);
    }
    status_ = libkineto::TraceStatus::READY;
  }

  // Without one, kineto names rows 0-15 "GPU <n>".
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return device_info(devices_.empty() ? 0 : devices_.front());
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return resources_;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);  // owns the activities the logger was given
  }

  void pushCorrelationId(uint64_t id) override {
    push_correlation(id, /*user_scope=*/false);
  }
  void popCorrelationId() override {
    pop_correlation(/*user_scope=*/false);
  }
  void pushUserCorrelationId(uint64_t id) override {
    push_correlation(id, /*user_scope=*/true);
  }
  void popUserCorrelationId() override {
    pop_correlation(/*user_scope=*/true);
  }

 private:
  // Below the host's rows, in device order.
  static std::unique_ptr<libkineto::DeviceInfo> device_info(int device) {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, libkineto::kExceedMaxPid + device, c10::str("npu:", device), c10::str("NPU ", device)});
  }

  std::vector<DeviceActivity> activities_;
  std::vector<int> devices_;  // with activities, ascending
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::vector<libkineto::ResourceInfo> resources_;
};

class NpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    return name_;
  }

  const std::set<ActivityType>& availableActivities() const override {
    return types_;
  }

  // A session only when PrivateUse1's activity types are asked for: a CPU-only
  // profile shows no device rows, as on CUDA.
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& activity_types,
      const libkineto::Config& /*config*/) override {
    if (activity_types.count(ActivityType::CONCURRENT_KERNEL) == 0) {
      return nullptr;
    }
    return std::make_unique<NpuProfilerSession>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
      const std::set<ActivityType>& activity_types, const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  const std::string name_{"npusim"};
  const std::set<ActivityType> types_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                      ActivityType::CUDA_SYNC};
};

// The legacy profiler's device timing: events on the current stream.
struct NpuProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
      int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = current_device();
    if (device != nullptr) {
      *device = index;
    }
    auto marker = std::make_shared<NpuEvent>();
    marker->enable_timing = true;
    if (cpu_ns != nullptr) {
      *cpu_ns = c10::getTime();
    }
    event_record_unobserved(*marker, current_stream(index));
    *event = std::move(marker);
  }

  // Microseconds from the stream reaching `start` to it reaching `end`.
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
      const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) {
      return 0.0f;
    }
    const auto& first = *static_cast<const NpuEvent*>(start->get());
    const auto& second = *static_cast<const NpuEvent*>(end->get());
    if (first.device != second.device) {
      return 0.0f;  // a range whose ends are on two devices has no device time
    }
    event_synchronize(first);
    event_synchronize(second);
    // A range that began on one stream and ended on another may see its end
    // reached first: its device time is then none, never negative.
    return static_cast<float>(std::max(0.0, event_elapsed_ms(first, second) * 1000.0));
  }

  // No device-side annotations (NVTX's role) on the npu.
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex previous = current_device();
    for (int d = 0; d < device_count(); ++d) {
      set_current_device(static_cast<c10::DeviceIndex>(d));
      op(d);
    }
    set_current_device(previous);
  }

  void synchronize() const override {
    synchronize_all();
  }

  bool enabled() const override {
    return true;
  }
};

}  // namespace

void register_device_profiler() {
  static std::once_flag once;
  std::call_once(once, [] {
    static NpuProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
    libkineto::api().registerProfilerFactory([] { return std::make_unique<NpuActivityProfiler>(); });
  });
}

}  // namespace npusim
