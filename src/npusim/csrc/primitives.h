// ACL-like runtime primitives that the Python operator layer builds on.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace npusim {

// aclnnForeachCopy: the op-plugin's SINGLE_FOREACH_OP_TENSOR_COUNT.
constexpr size_t kSingleForeachOpTensorCount = 48;

// The fast route's device kernel: one task per chunk of at most
// kSingleForeachOpTensorCount pairs on the current stream of dsts[0]'s
// device, then one version bump per destination. Returns the chunk count once
// the tasks are enqueued, or, with `wait` (the legacy kernel's blocking
// non_blocking=False), once they are done (timeout_s < 0: no limit).
int64_t launch_foreach_copy(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs,
    bool wait, double timeout_s);

// aclrtMemcpyBatch: waits for the current stream (timeout_s, an error naming
// the stream), then copies raw bytes between host and device, pair by pair
// (src nbytes each), and bumps the destinations' versions.
void memcpy_batch(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs, double timeout_s);

// aclrtMemcpyBatchAsync: the same copies as one task on the current stream.
// Pageable host sources are staged at call time in one block; a pageable host
// destination makes the call wait for the task (as for copy_).
void memcpy_batch_async(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs);

// The fast route in one native call (the op plugin's hot path): upstream's
// argument checks, then PyTorch's predicate with the profile's flags. Returns
// the chunk count when the fast kernel ran (launch_foreach_copy), 0 when the
// predicate holds but the kernel cannot take the lists (a dtype outside
// `fast_dtypes`, a ScalarType bit mask, or host tensors), -1 when it does not.
int64_t foreach_copy_fast(const std::vector<at::Tensor>& self, const std::vector<at::Tensor>& src, bool nd_out,
    int64_t fast_dtypes, bool wait, double timeout_s);

// The bit mask of ScalarTypes foreach_copy_fast takes.
int64_t dtype_mask(const std::vector<at::ScalarType>& dtypes);

// PyTorch's own fast-route predicate over a whole list pair.
bool can_use_fast_route(const std::vector<at::Tensor>& self, const std::vector<at::Tensor>& src);

// PyTorch's own foreach argument checks (same errors as upstream).
void check_foreach_api_restrictions(
    const std::vector<at::Tensor>& self, const std::vector<at::Tensor>& src);

// Bumps the version counter of each tensor, as upstream foreach kernels do.
void increment_version(const std::vector<at::Tensor>& tensors);

}  // namespace npusim
