// npu tensors shared between processes (ipc.cpp): their memory moved into
// POSIX shared memory, and mapped again by the receiving process.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace npusim {

// The descriptor of the shared memory `owner`'s storage lives in, moving the
// storage there first (synchronizing its device) if it is not yet shared.
int share_npu_storage(const at::Tensor& owner);
// The storage another process shared (its descriptor `fd`, `nbytes` long) as
// an npu storage of `device`, returned as a 1-D uint8 tensor over all of it.
at::Tensor open_shared_npu_storage(int fd, int64_t nbytes, int device);

}  // namespace npusim
