// The npu kernel of aten::_foreach_copy_: the fast route in native code, every
// other route through the Python op plugin. See Note [Native _foreach_copy_ kernel].
#pragma once

#include <cstdint>

namespace npusim {

// What the kernel mirrors of the Python routing state; each part is pushed by
// the Python module that owns it, whenever it changes.
struct ForeachCopyMirror {
  // The capability profile (runtime/profiles.py).
  bool kernel = false;  // foreach_copy_kernel: false is DO_COMPATIBILITY, the Python route
  bool nd_out = false;
  int64_t fast_dtypes = 0;  // fast_dtype_mask: a bit per ScalarType (dtype_mask)
  double sync_timeout_s = -1.0;
  // The mode (ops/foreach_copy.py): the legacy kernel passes the caller's non_blocking down.
  bool legacy = false;
  // Whether a route trace is active (ops/trace.py): trace records are built in Python.
  bool traced = false;
};

void set_foreach_copy_profile(bool kernel, bool nd_out, int64_t fast_dtypes, double sync_timeout_s);
void set_foreach_copy_legacy(bool legacy);
void set_foreach_copy_traced(bool traced);
ForeachCopyMirror foreach_copy_mirror();

// Calls of the kernel so far: (fast route taken natively, handed to the Python routing).
struct ForeachCopyCounts {
  int64_t native;
  int64_t routed;
};
ForeachCopyCounts foreach_copy_counts();

// Registers the kernel for aten::_foreach_copy_ on PrivateUse1, once. The op
// plugin calls it after defining npusim::_foreach_copy_routed and pushing the mirror.
void register_foreach_copy_kernel();

}  // namespace npusim
