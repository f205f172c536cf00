// Pinned host memory (host_allocator.cpp): the allocator behind
// pin_memory(), the staging of pageable copies and torch.accelerator's host
// allocator, with stream-ordered release (Note [Stream-ordered free]).
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>

namespace npusim {

c10::Allocator* pinned_allocator();
c10::DataPtr allocate_pinned(size_t nbytes);
bool is_pinned_ptr(const void* ptr);
// Releases freed pinned blocks that no stream can still touch.
void reclaim_pinned_frees();

// CUDA's host allocator statistics (torch.cuda.host_memory_stats), as
// PyTorch's at::HostStats holds them. See Note [Pinned host memory statistics].
at::HostStats host_stats();
void reset_host_peak_stats();
void reset_host_accumulated_stats();

}  // namespace npusim
