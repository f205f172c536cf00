// Host memory behind the device caching allocator's segments: mapping them,
// and whether the host can give another one.
#include "host_memory.h"

#include "plan_mode.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>

namespace npusim {

// Note [Host memory behind the device]
// Simulated device memory is host memory, and the simulated capacity (64 GiB
// for training_soc) is usually more than the host has: a cache that stays
// inside the device's capacity can still push the host into swap or the
// kernel's OOM killer. So a new segment must also fit in the host. Before
// the caching allocator maps a segment it asks host_headroom: the host's
// available memory, less the segment, must stay above a margin (by default
// 1/32 of the host's memory, clamped to [128 MiB, 1 GiB];
// NPUSIM_HOST_MEMORY_MARGIN sets it, 0 turns the check off). "Available" is
// /proc/meminfo's MemAvailable (what the kernel can give without swapping),
// and, under a cgroup memory limit below the host's size (a container), the
// smaller of that and the limit less the cgroup's usage net of reclaimable
// file pages. Reading those files costs about 10 us, so it happens only when
// a segment is mapped (not per allocation), and at most every 100 ms: in
// between, the figure read last is lowered by the segments mapped since
// (their pages count as used from the start, although the host commits them
// only when touched). A segment that does not fit makes the allocator read
// again, release cached blocks, and retry; when it still does not fit, the
// OutOfMemoryError says the host ran out, with the host's and the device's
// figures. Segments are mapped with mmap, one mapping each, rather than
// taken from malloc, whose arenas keep freed memory (glibc raises its mmap
// threshold up to 32 MiB after frees): releasing a segment must give its
// pages back to the host.

namespace {

std::atomic<int64_t> g_mapped_bytes{0};
std::atomic<int> g_failing_maps{0};  // fail_host_mappings: mappings still to refuse

struct HostProbe {
  std::mutex mutex;
  int64_t margin = -1;            // -1: the default, from the host's size
  int64_t simulated = -1;         // simulate_host_memory's figure, -1: none
  int64_t available = -1;         // at the last reading
  int64_t mapped_then = 0;        // g_mapped_bytes at the last reading
  std::chrono::steady_clock::time_point read_at{};
  int64_t total = -1;             // MemTotal
};
HostProbe& g_probe = *new HostProbe();

constexpr auto kReadEvery = std::chrono::milliseconds(100);

// The text of a small file such as /proc/meminfo ("" when it cannot be read).
std::string read_small_file(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return {};
  }
  std::string text(8192, '\0');
  size_t used = 0;
  while (used < text.size()) {
    const ssize_t n = ::read(fd, &text[used], text.size() - used);
    if (n <= 0) {
      break;
    }
    used += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(used);
  return text;
}

// The number after `key` in `text` (times `unit`), or -1.
int64_t field(const std::string& text, const char* key, int64_t unit) {
  const size_t at = text.find(key);
  if (at == std::string::npos) {
    return -1;
  }
  const char* p = text.c_str() + at + std::strlen(key);
  while (*p == ' ' || *p == '\t' || *p == ':') {
    ++p;
  }
  if (*p < '0' || *p > '9') {
    return -1;  // "max": no limit
  }
  return std::strtoll(p, nullptr, 10) * unit;
}

// What a cgroup memory limit leaves (-1: no limit below the host's size).
int64_t cgroup_headroom(int64_t host_total) {
  struct Files {
    const char* limit;
    const char* usage;
    const char* stat;
    const char* reclaimable;
  };
  for (const Files& f : {Files{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
                             "/sys/fs/cgroup/memory.stat", "inactive_file "},
                         Files{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                             "/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory/memory.stat",
                             "total_inactive_file "}}) {
    const int64_t limit = field(read_small_file(f.limit), "", 1);
    if (limit <= 0 || (host_total > 0 && limit >= host_total)) {
      continue;
    }
    const int64_t usage = field(read_small_file(f.usage), "", 1);
    const int64_t reclaimable = std::max<int64_t>(0, field(read_small_file(f.stat), f.reclaimable, 1));
    return usage < 0 ? -1 : std::max<int64_t>(0, limit - usage + reclaimable);
  }
  return -1;
}

// Reads the host's figures (probe lock held).
void read_host_locked(HostProbe& p) {
  const std::string meminfo = read_small_file("/proc/meminfo");
  p.total = field(meminfo, "MemTotal", 1024);
  int64_t available = field(meminfo, "MemAvailable", 1024);
  const int64_t cgroup = cgroup_headroom(p.total);
  if (cgroup >= 0) {
    available = available < 0 ? cgroup : std::min(available, cgroup);
  }
  p.available = available;
  p.mapped_then = g_mapped_bytes.load();
  p.read_at = std::chrono::steady_clock::now();
}

int64_t margin_locked(const HostProbe& p) {
  if (p.margin >= 0) {
    return p.margin;
  }
  const int64_t total = p.total > 0 ? p.total : (int64_t{8} << 30);
  return std::clamp<int64_t>(total / 32, int64_t{128} << 20, int64_t{1} << 30);
}

// The estimate: the figure read or simulated, less what was mapped since.
int64_t estimate_locked(const HostProbe& p) {
  const int64_t base = p.simulated >= 0 ? p.simulated : p.available;
  return base < 0 ? -1 : base - (g_mapped_bytes.load() - p.mapped_then);
}

}  // namespace

void* map_segment(size_t nbytes) {
  for (int left = g_failing_maps.load(); left > 0;) {
    if (g_failing_maps.compare_exchange_weak(left, left - 1)) {
      return nullptr;  // as mmap's ENOMEM
    }
  }
  // Plan mode's segments are never written (Note [Plan mode]): no swap is reserved for them.
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (device_computes() ? 0 : MAP_NORESERVE);
  void* ptr = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (ptr == MAP_FAILED) {
    return nullptr;
  }
  g_mapped_bytes.fetch_add(static_cast<int64_t>(nbytes));
  return ptr;
}

void unmap_segment(void* ptr, size_t nbytes) {
  ::munmap(ptr, nbytes);
  g_mapped_bytes.fetch_sub(static_cast<int64_t>(nbytes));
}

int64_t mapped_segment_bytes() {
  return g_mapped_bytes.load();
}

HostHeadroom host_headroom(size_t nbytes) {
  HostProbe& p = g_probe;
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.total < 0 && p.simulated < 0) {
    read_host_locked(p);
  }
  HostHeadroom h;
  h.margin = margin_locked(p);
  if (h.margin == 0 || !device_computes()) {  // off, or plan mode's pages are never backed
    return h;  // the check is off
  }
  const auto fits = [&] {
    h.available = estimate_locked(p);
    return h.available < 0 || h.available - static_cast<int64_t>(nbytes) >= h.margin;
  };
  if (p.simulated < 0 && std::chrono::steady_clock::now() - p.read_at > kReadEvery) {
    read_host_locked(p);
  }
  h.fits = fits();
  if (!h.fits && p.simulated < 0) {
    read_host_locked(p);  // the estimate is pessimistic: ask the host before saying no
    h.fits = fits();
  }
  return h;
}

void set_host_memory_margin(int64_t bytes) {
  std::lock_guard<std::mutex> lock(g_probe.mutex);
  g_probe.margin = bytes < 0 ? -1 : bytes;
}

void fail_host_mappings(int count) {
  g_failing_maps.store(std::max(count, 0));
}

void simulate_host_memory(int64_t bytes) {
  HostProbe& p = g_probe;
  std::lock_guard<std::mutex> lock(p.mutex);
  p.simulated = bytes < 0 ? -1 : bytes;
  p.mapped_then = g_mapped_bytes.load();
  if (bytes < 0) {
    read_host_locked(p);
  }
}

}  // namespace npusim
