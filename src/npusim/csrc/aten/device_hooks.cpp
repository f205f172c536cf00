// PrivateUse1 plumbing: the device guard (devices, streams, events), the
// accelerator hooks (pinned memory, generators, storage resize) and the
// allocator registration. Each override forwards to the runtime floor.
#include "device_hooks.h"

#include "generator.h"
#include "../runtime/cpu_allocator.h"
#include "../runtime/device_allocator.h"
#include "../runtime/event.h"
#include "../runtime/host_allocator.h"
#include "../runtime/plan_mode.h"
#include "../runtime/stream.h"
#include "../runtime/timing.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstring>
#include <mutex>

namespace npusim {
namespace {

NpuEvent* as_event(void* event) {
  return static_cast<NpuEvent*>(event);
}

struct NpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kNpu;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    const auto old = current_device();
    set_current_device(d.index());
    return c10::Device(kNpu, old);
  }
  c10::Device getDevice() const override {
    return c10::Device(kNpu, current_device());
  }
  void setDevice(c10::Device d) const override {
    set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count() && !in_bad_fork()) {
      set_current_device(d.index());
    }
  }
  c10::Stream getStream(c10::Device d) const override {
    return current_stream(d.index()).unwrap();
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return default_stream(d.index()).unwrap();
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return stream_from_pool(d.index() < 0 ? current_device() : d.index(), priority).unwrap();
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return stream_from_pool(d.index() < 0 ? current_device() : d.index(), high_priority ? -1 : 0)
        .unwrap();
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return exchange_current_stream(s);
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    try {
      trace_stream_op(StreamOp::kDestroyEvent, event, -1, -1);
    } catch (...) {  // an observer's failure must not escape a noexcept destructor
    }
    delete as_event(event);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
      const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
        "Event device index ", static_cast<int>(device_index),
        " does not match recording stream's device index ", static_cast<int>(stream.device_index()), ".");
    if (*event == nullptr) {
      auto* created = new NpuEvent();
      created->enable_timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      *event = created;
    }
    event_record(*as_event(*event), stream_for(stream));
    trace_stream_op(StreamOp::kRecordEvent, *event, stream.device_index(), stream.id());
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event != nullptr) {
      stream_wait_event(stream_for(stream), *as_event(event));
      trace_stream_op(StreamOp::kWaitEvent, event, stream.device_index(), stream.id());
    }
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || event_query(*as_event(event));
  }
  bool queryStream(const c10::Stream& stream) const override {
    NpuStream& s = stream_for(stream);
    refuse_unsafe_call_during_capture("Stream.query", &s);  // Note [Capture-time refusals]
    if (s.failed()) {
      raise_device_failure(s.device(), "Stream.query");  // Note [Sticky device errors]
    }
    return s.query_chip_time();
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    NpuStream& s = stream_for(stream);
    refuse_unsafe_call_during_capture("Stream.synchronize", &s);
    s.synchronize();
    trace_stream_op(StreamOp::kSyncStream, nullptr, stream.device_index(), stream.id());
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      event_synchronize(*as_event(event));
      trace_stream_op(StreamOp::kSyncEvent, event, -1, -1);
    }
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    const c10::DeviceIndex device = device_index < 0 ? current_device() : device_index;
    refuse_unsafe_call_during_capture("synchronize", nullptr, device);
    synchronize_device(device);
    trace_stream_op(StreamOp::kSyncDevice, nullptr, device, -1);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "elapsed_time: both events must be recorded first");
    return event_elapsed_ms(*as_event(start), *as_event(end));
  }
  void recordDataPtrOnStream(const c10::DataPtr& data, const c10::Stream& stream) const override {
    record_stream(data, stream);
  }
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device_index(d.index() < 0 ? current_device() : d.index(), "get_device_capability");
    return c10::DeviceCapability();  // every dtype can be allocated and converted
  }
};

struct NpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_current_device(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = current_device();
    set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned_ptr(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return pinned_allocator();
  }
  // torch.Generator("npu"), torch.npu.default_generators: see Note [npu Philox stream].
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    if (device_index != -1) {
      check_device_index(device_index, "npu generator");
    }
    return new_generator(device_index);
  }
  at::Device getDeviceFromPtr(void*) const override {
    TORCH_CHECK(false, "npusim: getDeviceFromPtr is not supported (device memory is host memory)");
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
};

}  // namespace

void resize_storage_bytes(const c10::Storage& storage, size_t newsize) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "resize_: trying to resize an npu storage that is not resizable");
  const c10::DeviceIndex device = storage.device().index();
  const size_t old_size = impl->nbytes();
  c10::DataPtr fresh = allocate_device(device, newsize);
  const size_t keep = std::min(old_size, newsize);
  if (keep > 0 && work_runs(keep)) {  // plan mode writes no large work: Note [Plan mode]
    // Queued work may still write the old bytes: they are copied in stream order.
    void* const dst = fresh.get();
    const void* const src = impl->data();
    NpuStream& stream = current_stream(device);
    if (done_on_the_host_now(stream) && copy_task_us(keep) == 0.0) {
      std::memcpy(dst, src, keep);  // Note [Work on an idle stream]
    } else {
      stream.enqueue([dst, src, keep] { std::memcpy(dst, src, keep); }, copy_task_us(keep), "resize_copy");
    }
  }
  // The old block is released once no stream can touch it (Note [Stream-ordered free]).
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(newsize);
}

void register_device() {
  static std::once_flag once;
  std::call_once(once, [] {
    static NpuHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    static c10::impl::DeviceGuardImplRegistrar guard_registrar(kNpu, new NpuGuardImpl());
    c10::SetAllocator(kNpu, device_allocator());
    install_cpu_allocator();  // See Note [CPU kernels allocate device memory].
    register_device_profiler();  // See Note [Device tasks in torch.profiler].
  });
}

}  // namespace npusim
