#include "foreach_copy.h"

#include "../runtime/device.h"
#include "../runtime/npu_type.h"
#include "host_transfer.h"
#include "primitives.h"

#include <ATen/ATen.h>
#include <ATen/native/ForeachUtils.h>
#include <ATen/record_function.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

namespace npusim {
namespace {

// Note [The _foreach_copy_ router]
// The routing of _foreach_copy_ (docs/SPEC.md 4.1) has one owner: this kernel.
// FSDP2 calls it with lists of a thousand parameters per step, and a kernel in
// Python would make the dispatcher wrap every tensor of both lists as a fresh
// Python object per call only to hand them back to C++ (that round trip was
// most of the host time before the kernel was native; docs/BENCHMARKS.md). So
// every route is decided and issued here: compat (a profile without the
// kernel), then upstream's argument checks, then per dtype group of the
// source list (in order of first appearance) fast, batch or slow.
//
// What it decides from is set, never mirrored: the profile's routing fields
// (ForeachCopyConfig, handed over by runtime/profiles.py when a profile becomes
// current; Python reads none of them to route), the mode (owned here; the
// Python get/set functions are its accessors) and the batch-eligibility
// regression switch. The layer above keeps what is its own: the route trace
// builds its Python records from the ForeachCopyCall this kernel hands to the
// sink it installs (ops/trace.py), and the profiler sees each group's route as
// a user-scope range "npusim::foreach_copy[<route>]", as
// torch.profiler.record_function names it.

std::mutex g_config_mutex;
ForeachCopyConfig g_config;  // guarded by g_config_mutex: a call sees one consistent profile
std::atomic<bool> g_legacy{false};
std::atomic<bool> g_original_batch_eligibility{false};

std::mutex g_sink_mutex;
std::shared_ptr<const ForeachCopyTraceSink> g_sink;  // guarded by g_sink_mutex
std::atomic<bool> g_traced{false};

std::array<std::atomic<int64_t>, 4> g_route_counts{};

ForeachCopyConfig current_config() {
  const std::lock_guard<std::mutex> lock(g_config_mutex);
  return g_config;
}

// The route's profiler range, only while torch.profiler records (a range costs
// a callback lookup otherwise).
class RouteRange {
 public:
  RouteRange(bool profiling, ForeachCopyRoute route) {
    if (profiling) {
      range_.emplace(at::RecordScope::USER_SCOPE);
      if (range_->isActive()) {
        range_->before(kNames[static_cast<int>(route)]);
      }
    }
  }

 private:
  static constexpr std::array<const char*, 4> kNames = {
      "npusim::foreach_copy[fast]", "npusim::foreach_copy[batch]", "npusim::foreach_copy[slow]",
      "npusim::foreach_copy[compat]"};
  std::optional<at::RecordFunction> range_;
};

void slow_path(at::TensorList self, at::TensorList src, bool non_blocking) {
  // copy_ bumps each destination's version counter itself.
  for (size_t i = 0; i < self.size(); ++i) {
    self[i].copy_(src[i], non_blocking);
  }
}

bool fast_dtype(const ForeachCopyConfig& config, c10::ScalarType dtype) {
  return ((config.fast_dtypes >> static_cast<int>(dtype)) & 1) != 0;
}

// The op-plugin's check_tensor_device_dtype_base plus npusim's correction
// (docs/SPEC.md 4.1): whether the lists may take the batched memcpy.
bool batch_eligible(at::TensorList self, at::TensorList src, bool non_blocking) {
  const c10::Device dst_device = self[0].device();
  const c10::Device src_device = src[0].device();
  // One device per list also rules out mixed directions (some H2D, some D2H).
  for (const at::Tensor& t : self) {
    if (t.device() != dst_device) {
      return false;
    }
  }
  for (const at::Tensor& t : src) {
    if (t.device() != src_device) {
      return false;
    }
  }
  c10::Device npu = dst_device;
  if (dst_device.type() == kNpu && src_device.is_cpu()) {
    npu = dst_device;
  } else if (dst_device.is_cpu() && src_device.type() == kNpu) {
    npu = src_device;
  } else {
    return false;  // device-to-device (or host-to-host within a mixed list)
  }
  if (non_blocking && npu.index() != current_device()) {
    return false;  // the async batch is enqueued on the current device's stream
  }
  // The batch copies src's raw bytes: anything but the same byte layout corrupts data.
  return g_original_batch_eligibility.load(std::memory_order_relaxed) || same_byte_layouts(self.vec(), src.vec());
}

// Copies one dtype group. `fast_route` is nd_out && can_use_fast_route when the caller already knows it.
ForeachCopyGroup copy_group(at::TensorList self, at::TensorList src, bool non_blocking, const ForeachCopyConfig& config,
    bool legacy, bool profiling, std::optional<bool> fast_route) {
  const int64_t pairs = static_cast<int64_t>(self.size());
  const c10::ScalarType dtype = src[0].scalar_type();
  const bool fast = fast_route.has_value() ? *fast_route : config.nd_out && at::native::can_use_fast_route(self, src);
  // can_use_fast_route puts every tensor on one device; a group of a mixed-device
  // list may be host-only, which the device kernel cannot copy.
  if (fast && src[0].device().type() == kNpu && fast_dtype(config, dtype)) {
    // Aligned: asynchronous whatever the caller's non_blocking (as CUDA's multi_tensor_apply).
    const bool passed = !legacy || non_blocking;
    const RouteRange range(profiling, ForeachCopyRoute::kFast);
    const int64_t chunks = launch_foreach_copy(self, src, /*wait=*/!passed, config.sync_timeout_s);
    return {ForeachCopyRoute::kFast, pairs, chunks, passed, dtype};
  }
  // A fast route (e.g. a dtype the kernel lacks) is device-to-device: never batch-eligible.
  const bool runtime_has_batch = non_blocking ? config.memcpy_batch_async : config.memcpy_batch;
  if (!fast && config.batch && runtime_has_batch && batch_eligible(self, src, non_blocking)) {
    const RouteRange range(profiling, ForeachCopyRoute::kBatch);
    if (non_blocking) {
      memcpy_batch_async(self.vec(), src.vec());
    } else {
      memcpy_batch(self.vec(), src.vec(), config.sync_timeout_s);
    }
    return {ForeachCopyRoute::kBatch, pairs, 1, non_blocking, dtype};
  }
  const RouteRange range(profiling, ForeachCopyRoute::kSlow);
  slow_path(self, src, non_blocking);
  return {ForeachCopyRoute::kSlow, pairs, 0, non_blocking, dtype};
}

// Pairs grouped by source dtype, groups in order of first appearance.
std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> group_by_src_dtype(
    at::TensorList self, at::TensorList src) {
  std::vector<c10::ScalarType> dtypes;
  std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> groups;
  for (size_t i = 0; i < src.size(); ++i) {
    const c10::ScalarType dtype = src[i].scalar_type();
    size_t g = 0;
    while (g < dtypes.size() && dtypes[g] != dtype) {
      ++g;
    }
    if (g == dtypes.size()) {
      dtypes.push_back(dtype);
      groups.emplace_back();
    }
    groups[g].first.push_back(self[i]);
    groups[g].second.push_back(src[i]);
  }
  return groups;
}

void count_route(const ForeachCopyGroup& group) {
  g_route_counts[static_cast<int>(group.route)].fetch_add(1, std::memory_order_relaxed);
}

void emit_record(ForeachCopyCall&& call) {
  std::shared_ptr<const ForeachCopyTraceSink> sink;
  {
    const std::lock_guard<std::mutex> lock(g_sink_mutex);
    sink = g_sink;
  }
  if (sink) {
    (*sink)(call);
  }
}

bool all_same_dtype(at::TensorList src) {
  const c10::ScalarType dtype = src[0].scalar_type();
  for (const at::Tensor& s : src) {
    if (s.scalar_type() != dtype) {
      return false;
    }
  }
  return true;
}

// The PrivateUse1 kernel of aten::_foreach_copy_(Tensor(a!)[] self, Tensor[]
// src, bool non_blocking=False) -> (): the same argument errors, results and
// version bumps (one per destination) as upstream; routes per docs/SPEC.md 4.1.
void foreach_copy_(at::TensorList self, at::TensorList src, bool non_blocking) {
  const ForeachCopyConfig config = current_config();
  const bool legacy = g_legacy.load(std::memory_order_relaxed);
  const bool profiling = torch::profiler::impl::profilerEnabled();
  const bool traced = g_traced.load(std::memory_order_acquire);
  if (!config.kernel) {
    // Upstream's slow kernel, which DO_COMPATIBILITY falls back to, begins with the same checks.
    at::native::check_foreach_api_restrictions(self, src);
    {
      const RouteRange range(profiling, ForeachCopyRoute::kCompat);
      slow_path(self, src, non_blocking);
    }
    const ForeachCopyGroup group{ForeachCopyRoute::kCompat, static_cast<int64_t>(self.size()), 0, non_blocking,
        std::nullopt};
    count_route(group);
    if (traced) {
      emit_record(ForeachCopyCall{{group}, non_blocking, legacy});
    }
    return;
  }
  at::native::check_foreach_api_restrictions(self, src);
  const bool fast_route = config.nd_out && at::native::can_use_fast_route(self, src);
  // can_use_fast_route implies one dtype across both lists, so the common case
  // needs no per-tensor dtype scan.
  if (fast_route || all_same_dtype(src)) {
    const ForeachCopyGroup group = copy_group(self, src, non_blocking, config, legacy, profiling, fast_route);
    count_route(group);
    if (traced) {
      emit_record(ForeachCopyCall{{group}, non_blocking, legacy});
    }
    return;
  }
  ForeachCopyCall call{{}, non_blocking, legacy};
  for (const auto& [group_self, group_src] : group_by_src_dtype(self, src)) {
    call.groups.push_back(copy_group(group_self, group_src, non_blocking, config, legacy, profiling, std::nullopt));
    count_route(call.groups.back());
  }
  if (traced) {
    emit_record(std::move(call));
  }
}

}  // namespace

const char* route_name(ForeachCopyRoute route) {
  static constexpr std::array<const char*, 4> kNames = {"fast", "batch", "slow", "compat"};
  return kNames[static_cast<int>(route)];
}

void set_foreach_copy_config(const ForeachCopyConfig& config) {
  const std::lock_guard<std::mutex> lock(g_config_mutex);
  g_config = config;
}

ForeachCopyConfig foreach_copy_config() {
  return current_config();
}

void set_foreach_copy_legacy(bool legacy) {
  g_legacy.store(legacy, std::memory_order_relaxed);
}

bool foreach_copy_legacy() {
  return g_legacy.load(std::memory_order_relaxed);
}

void set_original_batch_eligibility(bool original) {
  g_original_batch_eligibility.store(original, std::memory_order_relaxed);
}

void set_foreach_copy_trace_sink(ForeachCopyTraceSink sink) {
  const std::lock_guard<std::mutex> lock(g_sink_mutex);
  g_sink = sink ? std::make_shared<const ForeachCopyTraceSink>(std::move(sink)) : nullptr;
  g_traced.store(g_sink != nullptr, std::memory_order_release);
}

bool foreach_copy_traced() {
  return g_traced.load(std::memory_order_acquire);
}

std::vector<int64_t> foreach_copy_route_counts() {
  std::vector<int64_t> counts;
  for (const auto& c : g_route_counts) {
    counts.push_back(c.load(std::memory_order_relaxed));
  }
  return counts;
}

void register_foreach_copy_kernel() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked: the registration lasts as long as the process, and no destructor
    // deregisters it at exit while other libraries are torn down.
    auto* lib = new torch::Library(
        torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    lib->impl("_foreach_copy_", TORCH_FN(foreach_copy_));
  });
}

}  // namespace npusim
