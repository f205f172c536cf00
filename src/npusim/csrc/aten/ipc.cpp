// npu storages in shared memory, for torch.multiprocessing.
//
// Note [Sharing npu tensors between processes]
// CUDA shares a device tensor through an IPC handle of its device memory.
// npu device memory is host memory, so it is shared as CPU memory is: the
// first time a storage is sent, its bytes are moved into a POSIX shared
// memory segment (a file descriptor, unlinked at once, as
// UntypedStorage._share_fd_cpu_ does) that replaces the storage's memory in
// place and stays accounted as device memory of its device; the receiver maps
// the same segment as an npu storage of the same device index. Both processes
// then see the same bytes; the segment lives as long as any mapping or
// descriptor of it. Before a storage is handed over, its device is
// synchronized, so the receiver finds the sender's queued writes done
// (CUDA records an event for the receiver to wait on; npusim's processes share
// no streams). The receiver's mapping is not counted in its memory statistics
// (CUDA does not count memory opened through IPC either). The Python side is
// npusim/runtime/ipc.py.
#include "ipc.h"

#include "../runtime/device.h"
#include "../runtime/device_allocator.h"
#include "../runtime/stream.h"

#include <ATen/ATen.h>
#include <ATen/MapAllocator.h>

#include <unistd.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

namespace npusim {
namespace {

// The DataPtr context of shared memory: the mapping, and its descriptor for
// sending it again.
struct SharedMapping {
  at::DataPtr mapping;
  int fd;
};

std::mutex& g_shared_mutex = *new std::mutex();
// Shared segments of this process by address -> their descriptor.
std::unordered_map<const void*, int>& g_shared_fds = *new std::unordered_map<const void*, int>();

void delete_shared_mapping(void* context) {
  auto* shared = static_cast<SharedMapping*>(context);
  {
    std::lock_guard<std::mutex> lock(g_shared_mutex);
    g_shared_fds.erase(shared->mapping.get());
  }
  delete shared;  // unmaps, closes the descriptor
}

c10::DataPtr shared_data_ptr(at::DataPtr&& mapping, c10::Device device) {
  void* ptr = mapping.get();
  const int fd = at::MapAllocator::fromDataPtr(mapping)->fd();
  {
    std::lock_guard<std::mutex> lock(g_shared_mutex);
    g_shared_fds[ptr] = fd;
  }
  return c10::DataPtr(ptr, new SharedMapping{std::move(mapping), fd}, &delete_shared_mapping, device);
}

int shared_fd(const void* ptr) {
  std::lock_guard<std::mutex> lock(g_shared_mutex);
  const auto it = g_shared_fds.find(ptr);
  return it == g_shared_fds.end() ? -1 : it->second;
}

}  // namespace

// The descriptor of the shared memory `owner`'s storage lives in, moving it
// there first if needed (see the Note).
int share_npu_storage(const at::Tensor& owner) {
  TORCH_CHECK(owner.device().type() == c10::DeviceType::PrivateUse1,
      "share_npu_storage: expected an npu tensor, got one on ", owner.device());
  c10::StorageImpl* impl = owner.storage().unsafeGetStorageImpl();
  const c10::DeviceIndex device = owner.device().index();
  const size_t nbytes = impl->nbytes();
  TORCH_CHECK(nbytes > 0, "share_npu_storage: an empty storage has no memory to share");
  synchronize_device(device);  // queued work on the storage is done before anyone else reads it
  const int fd = shared_fd(impl->data());
  if (fd >= 0) {
    return fd;
  }
  constexpr int kFlags = at::ALLOCATOR_MAPPED_SHAREDMEM | at::ALLOCATOR_MAPPED_EXCLUSIVE |
      at::ALLOCATOR_MAPPED_KEEPFD | at::ALLOCATOR_MAPPED_UNLINK;
  at::DataPtr mapping = at::MapAllocator::makeDataPtr(at::NewProcessWideShmHandle(), kFlags, nbytes, nullptr);
  std::memcpy(mapping.get(), impl->data(), nbytes);
  c10::DataPtr shared = adopt_as_device(shared_data_ptr(std::move(mapping), c10::Device(c10::kCPU)), nbytes,
      device);
  const int new_fd = shared_fd(shared.get());
  impl->set_data_ptr_noswap(std::move(shared));  // the old block is freed (nothing can still use it)
  return new_fd;
}

// The storage another process shared (its descriptor `fd`, `nbytes` long) as
// an npu storage of `device`, returned as a 1-D uint8 tensor over all of it.
at::Tensor open_shared_npu_storage(int fd, int64_t nbytes, int device) {
  check_device_index(device, "torch.multiprocessing: rebuilding an npu tensor");
  TORCH_CHECK(nbytes > 0, "open_shared_npu_storage: expected a positive size, got ", nbytes);
  const int own = dup(fd);
  TORCH_CHECK(own >= 0, "open_shared_npu_storage: could not duplicate descriptor ", fd, ": ", std::strerror(errno));
  constexpr int kFlags = at::ALLOCATOR_MAPPED_SHAREDMEM | at::ALLOCATOR_MAPPED_NOCREATE |
      at::ALLOCATOR_MAPPED_KEEPFD | at::ALLOCATOR_MAPPED_FROMFD;
  at::DataPtr mapping = at::MapAllocator::makeDataPtr(at::WITH_FD, "", own, kFlags, static_cast<size_t>(nbytes),
      nullptr);
  c10::DataPtr data = shared_data_ptr(std::move(mapping),
      c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(nbytes), std::move(data),
      device_allocator(), /*resizable=*/true);
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), caffe2::TypeMeta::Make<uint8_t>());
  out.unsafeGetTensorImpl()->set_sizes_contiguous({nbytes});
  return out;
}

}  // namespace npusim
