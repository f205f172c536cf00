// The allocator lent to CPU kernels: the fallback's CPU kernels allocate
// their outputs and temporaries from the npu caching allocator.
#include "cpu_allocator.h"

#include "device.h"
#include "device_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>

namespace npusim {

// Note [CPU kernels allocate device memory]
// The fallback runs PyTorch's CPU kernels on device memory, and their fresh
// outputs (and temporaries) are allocated with the CPU allocator. Rather than
// adopting that host memory after the kernel (a host malloc, a segment that
// is never cached, a host free at release, and statistics unlike CUDA's:
// reserved memory that drops with every free), npusim installs a CPU
// allocator that forwards to PyTorch's own except while a CpuAllocationsOnDevice
// scope is active on the calling thread: then allocations come from the
// device's caching allocator, on the current stream, exactly as the npu
// output of a device kernel would (rounded, cached, counted in allocated and
// reserved, visible in snapshots). While the CPU kernel holds such a block
// ("lent") its DataPtr says CPU and has the pointer as its context, because
// Allocator::raw_allocate insists on that (oneDNN's bf16 matmul uses it);
// the deleter names the device and the pool's map of segments finds the
// block. as_device_memory turns a lent block back into an ordinary npu
// allocation; a temporary the kernel drops is freed like any npu block.
// Worker threads of the kernel (at::parallel_for) do not see the scope and
// allocate host memory, which the fallback then adopts. Nothing else changes
// for CPU code: outside a scope the CPU allocator's own memory comes back.
// The scope serves ops run on the host. A stream task's kernel (Note [Compute
// on the stream]) writes outputs the host allocated at launch, and its own
// allocations are host memory: the caching allocator may hand a block freed
// on the host to the next allocation on the same stream while the block's
// earlier queued work is still pending (Note [Stream-ordered free]), which is
// safe only for work ordered after that queue; a kernel running on the
// stream's worker is not (the tasks queued behind it may still read the
// block), and device memory statistics then count what the host allocated,
// as CUDA's do, not what a kernel happens to hold while it runs.

namespace {

// The device whose caching allocator serves this thread's CPU allocations
// (-1: none); see Note [CPU kernels allocate device memory].
thread_local c10::DeviceIndex tls_cpu_allocations_device = -1;

// Blocks handed to a CPU kernel and not yet claimed back by as_device_memory
// nor freed: while there are none, a raw_deallocate of host memory looks
// nowhere else.
std::atomic<int64_t> g_lent_blocks{0};
c10::DeleterFnPtr g_host_raw_deleter = nullptr;

// A lent block's DataPtr has the pointer as its context (raw_allocate,
// which oneDNN's bf16 matmul uses, insists on it); the deleter says the
// device, the pool's map of segments finds the block.
void free_lent(c10::DeviceIndex device, void* ptr) {
  g_lent_blocks.fetch_sub(1, std::memory_order_relaxed);
  free_block_at(device, ptr);
}

template <size_t D>
void free_lent_on(void* ptr) {
  free_lent(static_cast<c10::DeviceIndex>(D), ptr);
}

template <size_t... D>
constexpr std::array<c10::DeleterFnPtr, sizeof...(D)> lent_deleters(std::index_sequence<D...>) {
  return {&free_lent_on<D>...};
}
constexpr std::array<c10::DeleterFnPtr, kMaxDevices> kLentDeleters =
    lent_deleters(std::make_index_sequence<kMaxDevices>());

// The device of a lent block's DataPtr, or -1.
c10::DeviceIndex lent_device(const c10::DataPtr& data) {
  for (size_t d = 0; d < kLentDeleters.size(); ++d) {
    if (data.get_deleter() == kLentDeleters[d]) {
      return static_cast<c10::DeviceIndex>(d);
    }
  }
  return -1;
}

void raw_free_cpu(void* ptr) {
  if (g_lent_blocks.load(std::memory_order_relaxed) > 0) {
    for (int d = 0; d < device_count(); ++d) {
      if (is_lent_block(static_cast<c10::DeviceIndex>(d), ptr)) {
        free_lent(static_cast<c10::DeviceIndex>(d), ptr);
        return;
      }
    }
  }
  g_host_raw_deleter(ptr);
}

// PyTorch's CPU allocator, except inside a CpuAllocationsOnDevice scope; see
// Note [CPU kernels allocate device memory].
class CpuAllocator final : public c10::Allocator {
 public:
  explicit CpuAllocator(c10::Allocator* host) : host_(host) {}
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = tls_cpu_allocations_device;
    if (device < 0 || nbytes == 0) {
      return host_->allocate(nbytes);
    }
    c10::DataPtr block = allocate_device(device, nbytes);
    void* const ptr = block.get();
    block.release_context();  // the pool's map of segments knows the block
    g_lent_blocks.fetch_add(1, std::memory_order_relaxed);
    return c10::DataPtr(ptr, ptr, kLentDeleters[device], c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return g_host_raw_deleter == nullptr ? nullptr : &raw_free_cpu;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  c10::Allocator* const host_;
};

}  // namespace

CpuAllocationsOnDevice::CpuAllocationsOnDevice(c10::DeviceIndex device)
    : saved_(tls_cpu_allocations_device) {
  tls_cpu_allocations_device = device;
}

CpuAllocationsOnDevice::~CpuAllocationsOnDevice() {
  tls_cpu_allocations_device = saved_;
}

void install_cpu_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::Allocator* host = c10::GetCPUAllocator();
    g_host_raw_deleter = host->raw_deleter();
    static CpuAllocator allocator(host);
    c10::SetCPUAllocator(&allocator);
  });
}

c10::DataPtr as_device_memory(c10::DataPtr&& cpu, size_t nbytes, c10::DeviceIndex device) {
  const c10::DeviceIndex lent = lent_device(cpu);
  if (lent >= 0) {
    // A block of the caching allocator lent to the CPU kernel: it becomes an
    // ordinary npu allocation again.
    void* const ptr = cpu.get();
    cpu.release_context();
    g_lent_blocks.fetch_sub(1, std::memory_order_relaxed);
    return claim_block(lent, ptr);
  }
  if (cpu.get() == nullptr) {
    return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::PrivateUse1, device));  // nothing to account
  }
  return adopt_as_device(std::move(cpu), nbytes, device);
}

}  // namespace npusim
