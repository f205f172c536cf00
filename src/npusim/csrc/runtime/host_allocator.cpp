// The host (pinned) allocator as torch.accelerator sees it: without one
// registered for PrivateUse1, torch.accelerator.empty_host_cache() (which
// torch.accelerator.Graph calls on entering its context) dereferences null.
// It hands out the same pinned blocks as the hooks' pinned allocator.
#include "memory.h"

#include <ATen/core/CachingHostAllocator.h>

#include <cstring>

namespace npusim {
namespace {

class NpuHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_pinned(nbytes);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override {
    return true;  // frees are stream-ordered for every stream (Note [Stream-ordered free])
  }
  void empty_cache() override {
    reclaim_deferred_frees();  // there is no cache; release what no stream can still touch
  }
  at::HostStats get_stats() override {
    return {};
  }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

NpuHostAllocator g_host_allocator;

}  // namespace
}  // namespace npusim

REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, &npusim::g_host_allocator)
