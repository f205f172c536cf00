// ACL-like runtime primitives that the operator layer (the _foreach_copy_
// kernel, foreach_copy.h) builds on.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace npusim {

// aclnnForeachCopy: the op-plugin's SINGLE_FOREACH_OP_TENSOR_COUNT.
constexpr size_t kSingleForeachOpTensorCount = 48;

// The fast route's device kernel, for pairs that pass
// at::native::can_use_fast_route (the caller's check; not repeated here): one
// task per chunk of at most
// kSingleForeachOpTensorCount pairs on the current stream of dsts[0]'s
// device, then one version bump per destination. Returns the chunk count once
// the tasks are enqueued, or, with `wait` (the legacy kernel's blocking
// non_blocking=False), once they are done (timeout_s < 0: no limit).
int64_t launch_foreach_copy(at::TensorList dsts, at::TensorList srcs, bool wait, double timeout_s);

// aclrtMemcpyBatch: waits for the current stream (timeout_s, an error naming
// the stream), then copies raw bytes between host and device, pair by pair
// (src nbytes each), and bumps the destinations' versions.
void memcpy_batch(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs, double timeout_s);

// aclrtMemcpyBatchAsync: the same copies as one task on the current stream.
// Pageable host sources are staged at call time in one block; a pageable host
// destination makes the call wait for the task (as for copy_).
void memcpy_batch_async(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs);

// A task that does nothing but hold the current stream of `device` for
// duration_us (torch.npu._sleep, as torch.cuda._sleep spins a kernel): work
// queued behind it starts later, the host does not wait.
void launch_delay(c10::DeviceIndex device, double duration_us);

// The bit mask of ScalarTypes the _foreach_copy_ kernel's fast route takes
// (a profile's fast dtypes, ForeachCopyConfig in foreach_copy.h).
int64_t dtype_mask(const std::vector<at::ScalarType>& dtypes);

// Bumps the version counter of each tensor, as upstream foreach kernels do.
void increment_version(at::TensorList tensors);

}  // namespace npusim
