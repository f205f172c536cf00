// Host memory under the allocators (device memory is host memory): the
// aligned allocation pinned blocks take, the segments of the device caching
// allocator, whether the host can give a new segment without going short
// (Note [Host memory behind the device], host_memory.cpp), and byte counts as
// the allocators' messages write them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

namespace npusim {

// 64-byte aligned host memory of at least nbytes (null when the host has none).
inline void* raw_alloc(size_t nbytes) {
  void* ptr = nullptr;
  const size_t rounded = (nbytes + 63) / 64 * 64;
  if (posix_memalign(&ptr, 64, rounded) != 0) {
    return nullptr;
  }
  return ptr;
}

inline std::string format_bytes(int64_t n) {
  std::ostringstream out;
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  out.precision(u == 0 ? 0 : 2);
  out << std::fixed << v << " " << units[u];
  return out.str();
}

// A segment of the device caching allocator: `nbytes` (a multiple of the page
// size) of fresh host pages, mapped for the segment alone so that releasing
// it gives the pages back to the host at once; null when the host has none.
void* map_segment(size_t nbytes);
void unmap_segment(void* ptr, size_t nbytes);
// Bytes of segments mapped now, every device together.
int64_t mapped_segment_bytes();

struct HostHeadroom {
  bool fits = true;
  int64_t available = -1;  // bytes the host can still give (-1: not known)
  int64_t margin = 0;      // bytes the allocator leaves the host
};
// Whether a new segment of `nbytes` leaves the host at least its margin.
HostHeadroom host_headroom(size_t nbytes);
// The margin: bytes of host memory the allocator never takes (-1: the
// default, from the host's size; 0: no check).
void set_host_memory_margin(int64_t bytes);
// Test hook: the host has `bytes` available now, less every segment mapped
// from here on (-1: read the host again).
void simulate_host_memory(int64_t bytes);
// Test hook: the next `count` segment mappings fail as an mmap the host
// refuses would (0: none).
void fail_host_mappings(int count);

}  // namespace npusim
