// Host memory under the allocators (device memory is host memory): the one
// aligned allocation they take it from, and byte counts as their messages
// write them.
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

}  // namespace npusim
