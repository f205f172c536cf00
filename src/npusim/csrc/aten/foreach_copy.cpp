#include "foreach_copy.h"

#include "../runtime/npu_type.h"
#include "primitives.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/ForeachUtils.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>

namespace npusim {
namespace {

// Note [Native _foreach_copy_ kernel]
// The routing of _foreach_copy_ is product logic and lives in Python
// (ops/foreach_copy.py, docs/SPEC.md 4.1). A Python kernel registered for
// aten::_foreach_copy_, though, makes the dispatcher wrap every tensor of both
// lists as a fresh Python object on each call, and the fast route hands them
// straight back to C++: for FSDP2's lists of a thousand parameters that round
// trip was a large share of the call's host time (docs/BENCHMARKS.md,
// "simulation at CPU speed"). So the kernel of aten::_foreach_copy_ is this
// C++ function. It takes the fast route itself (upstream's checks, PyTorch's
// can_use_fast_route with the profile's nd_out, the profile's dtypes,
// launch_foreach_copy, which bumps the versions), in either mode: legacy only
// passes the caller's non_blocking down, waiting up to the profile's sync
// timeout. It hands every other call, unchanged, to the Python routing through
// the dispatcher (npusim::_foreach_copy_routed, defined by the op plugin, in
// ops/foreach_copy.py; tests/test_foreach_copy_native.py): a profile without
// the kernel (DO_COMPATIBILITY), an active route trace (its records are built
// in Python, so a trace sees exactly the routes Python takes), torch.profiler
// (the route ranges are Python record_function ranges), and any list the fast
// route does not take (mixed dtypes, batch, slow).
//
// The kernel decides from a mirror of the Python state it needs, never from
// Python objects: the profile's foreach_copy_kernel, nd_out, fast dtype mask and
// sync timeout (pushed by runtime/profiles.py whenever the current profile
// changes: at import, set_profile, use_profile on entry and exit), the mode
// (pushed by set_foreach_copy_mode, which foreach_copy_mode also goes
// through) and whether a route trace is active (pushed by trace_foreach_copy
// on entry and exit). The op plugin pushes the mode and registers the kernel
// at import, after runtime/profiles.py pushed the profile. A stale mirror
// would route silently wrong; the tests change each input and assert the
// route and foreach_copy_counts().

std::mutex mirror_mutex;
ForeachCopyMirror mirror;  // guarded by mirror_mutex: a call sees one consistent state
std::atomic<int64_t> native_calls{0};
std::atomic<int64_t> routed_calls{0};

ForeachCopyMirror current_mirror() {
  const std::lock_guard<std::mutex> lock(mirror_mutex);
  return mirror;
}

void route_in_python(at::TensorList self, at::TensorList src, bool non_blocking) {
  // Looked up on first use: the op plugin defines the op before registering this kernel.
  static const auto routed = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("npusim::_foreach_copy_routed", "")
                                 .typed<void(at::TensorList, at::TensorList, bool)>();
  routed_calls.fetch_add(1, std::memory_order_relaxed);
  // Straight to its npu kernel: the keys above this one were handled for
  // aten::_foreach_copy_ already, and the profiler shows no extra op.
  routed.redispatch(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), self, src, non_blocking);
}

// The PrivateUse1 kernel of aten::_foreach_copy_(Tensor(a!)[] self, Tensor[]
// src, bool non_blocking=False) -> (): the same argument errors, results and
// version bumps (one per destination) as upstream; routes per docs/SPEC.md 4.1.
void foreach_copy_(at::TensorList self, at::TensorList src, bool non_blocking) {
  const ForeachCopyMirror m = current_mirror();
  // The same check as the Python `_profiler_enabled`.
  if (!m.kernel || m.traced || torch::profiler::impl::profilerEnabled()) {
    route_in_python(self, src, non_blocking);
    return;
  }
  at::native::check_foreach_api_restrictions(self, src);
  // can_use_fast_route puts every tensor on one device; that may be the host
  // (a mixed list's host-only dtype group), which the device kernel cannot copy.
  if (!m.nd_out || !at::native::can_use_fast_route(self, src) || src[0].device().type() != kNpu ||
      ((m.fast_dtypes >> static_cast<int>(src[0].scalar_type())) & 1) == 0) {
    route_in_python(self, src, non_blocking);
    return;
  }
  // Aligned: asynchronous whatever the caller's non_blocking (as CUDA's multi_tensor_apply).
  const bool passed = !m.legacy || non_blocking;
  launch_foreach_copy(self, src, /*wait=*/!passed, m.sync_timeout_s);
  native_calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void set_foreach_copy_profile(bool kernel, bool nd_out, int64_t fast_dtypes, double sync_timeout_s) {
  const std::lock_guard<std::mutex> lock(mirror_mutex);
  mirror.kernel = kernel;
  mirror.nd_out = nd_out;
  mirror.fast_dtypes = fast_dtypes;
  mirror.sync_timeout_s = sync_timeout_s;
}

void set_foreach_copy_legacy(bool legacy) {
  const std::lock_guard<std::mutex> lock(mirror_mutex);
  mirror.legacy = legacy;
}

void set_foreach_copy_traced(bool traced) {
  const std::lock_guard<std::mutex> lock(mirror_mutex);
  mirror.traced = traced;
}

ForeachCopyMirror foreach_copy_mirror() {
  return current_mirror();
}

ForeachCopyCounts foreach_copy_counts() {
  return {native_calls.load(std::memory_order_relaxed), routed_calls.load(std::memory_order_relaxed)};
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
