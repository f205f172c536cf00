// Registration of the npu device with PyTorch (guard, hooks, allocator).
#pragma once

#include <c10/core/Storage.h>

namespace npusim {

// Installs the PrivateUse1 hooks, device guard and allocator; idempotent.
// Called from Python only after it has checked that no other backend owns
// PrivateUse1.
void register_device();

// Storage resize for PrivateUse1 (FSDP2 frees and re-allocates unsharded
// parameters with `untyped_storage().resize_(n)`); keeps the leading bytes.
void resize_storage_bytes(const c10::Storage& storage, size_t newsize);

}  // namespace npusim
