// ACL-like runtime primitives that the Python operator layer builds on.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace npusim {

// aclnnForeachCopy: the op-plugin's SINGLE_FOREACH_OP_TENSOR_COUNT.
constexpr size_t kSingleForeachOpTensorCount = 48;

// One device task on the current stream of dsts[0]'s device copying every
// pair; at most kSingleForeachOpTensorCount pairs. Returns once enqueued.
void launch_foreach_copy(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs);

// aclrtMemcpyBatch: blocking raw-byte copies between host and device, pair
// by pair (src nbytes each). The caller synchronizes the stream first.
void memcpy_batch(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs);

// aclrtMemcpyBatchAsync: the same copies as one task on the current stream.
// Pageable host sources are staged at call time; a pageable host destination
// makes the call wait for the task (as for copy_).
void memcpy_batch_async(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs);

// PyTorch's own fast-route predicate over a whole list pair.
bool can_use_fast_route(const std::vector<at::Tensor>& self, const std::vector<at::Tensor>& src);

// PyTorch's own foreach argument checks (same errors as upstream).
void check_foreach_api_restrictions(
    const std::vector<at::Tensor>& self, const std::vector<at::Tensor>& src);

// Bumps the version counter of each tensor, as upstream foreach kernels do.
void increment_version(const std::vector<at::Tensor>& tensors);

}  // namespace npusim
