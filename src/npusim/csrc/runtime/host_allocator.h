// Pinned host memory (host_allocator.cpp): the allocator behind
// pin_memory(), the staging of pageable copies and torch.accelerator's host
// allocator, with stream-ordered release (Note [Stream-ordered free]).
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>

namespace npusim {

c10::Allocator* pinned_allocator();
c10::DataPtr allocate_pinned(size_t nbytes);
bool is_pinned_ptr(const void* ptr);
// Releases freed pinned blocks that no stream can still touch.
void reclaim_pinned_frees();

struct HostStats {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak_allocated{0};
  std::atomic<int64_t> num_allocs{0};
  std::atomic<int64_t> num_frees{0};
};
const HostStats& host_stats();

}  // namespace npusim
