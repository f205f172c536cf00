// The npu kernel of aten::_foreach_copy_: the whole routing of docs/SPEC.md
// 4.1 (fast, batch, slow, compat). See Note [The _foreach_copy_ router].
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace npusim {

// What the router needs of the capability profile (docs/SPEC.md 4.3). The
// profile is a Python object (runtime/profiles.py); it hands these fields
// here when it becomes current, and nothing in Python routes by them.
struct ForeachCopyConfig {
  bool kernel = true;  // foreach_copy_kernel: false is DO_COMPATIBILITY, the slow path for the whole call
  bool nd_out = true;  // the ND foreach kernel: no fast route without it
  bool batch = true;  // batched memcpy on the SoC
  bool memcpy_batch = true;  // the runtime's blocking batched memcpy
  bool memcpy_batch_async = true;  // ... and its asynchronous one
  int64_t fast_dtypes = 0;  // a bit per ScalarType the fast route takes (dtype_mask)
  double sync_timeout_s = -1.0;  // a blocking batch's (and the legacy fast route's) stream wait
};
void set_foreach_copy_config(const ForeachCopyConfig& config);
ForeachCopyConfig foreach_copy_config();

// The mode (Note [Legacy mode] in ops/foreach_copy.py): the legacy kernel
// passes the caller's non_blocking to the fast route.
void set_foreach_copy_legacy(bool legacy);
bool foreach_copy_legacy();

// Regression only: the op-plugin's batch eligibility without npusim's per-pair
// dtype / numel / contiguity correction (ops.original_batch_eligibility).
void set_original_batch_eligibility(bool original);

// The route trace (docs/SPEC.md 4.2), one record per call that returned.
enum class ForeachCopyRoute : int { kFast = 0, kBatch = 1, kSlow = 2, kCompat = 3 };
const char* route_name(ForeachCopyRoute route);
struct ForeachCopyGroup {
  ForeachCopyRoute route;
  int64_t pairs;
  int64_t chunks;  // device tasks (fast); 1 for a batch; 0 for slow and compat
  bool non_blocking;  // what the route was given
  std::optional<c10::ScalarType> dtype;  // the group's source dtype; none for compat
};
struct ForeachCopyCall {
  std::vector<ForeachCopyGroup> groups;
  bool non_blocking;  // what the caller passed
  bool legacy;
};
// Installed by the layer above while a trace is active (empty: no records are
// built). Called on the calling thread after the call's copies were issued.
using ForeachCopyTraceSink = std::function<void(const ForeachCopyCall&)>;
void set_foreach_copy_trace_sink(ForeachCopyTraceSink sink);
bool foreach_copy_traced();

// Dtype groups copied so far, per route (index: ForeachCopyRoute).
std::vector<int64_t> foreach_copy_route_counts();

// Registers the kernel for aten::_foreach_copy_ on PrivateUse1, once.
void register_foreach_copy_kernel();

}  // namespace npusim
