#include "primitives.h"

#include "host_transfer.h"
#include "../runtime/device_allocator.h"
#include "../runtime/plan_mode.h"
#include "../runtime/stream.h"
#include "../runtime/timing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

namespace npusim {
namespace {

void check_pairs(const char* op, at::TensorList dsts, at::TensorList srcs) {
  TORCH_CHECK(!dsts.empty() && dsts.size() == srcs.size(), op,
      ": expected two non-empty lists of equal length, got ", dsts.size(), " and ", srcs.size());
}

// Pair checks shared by the batched memcpy primitives: host<->device only,
// one npu, and every byte read or written lies inside its storage. Returns
// the npu index.
c10::DeviceIndex check_batch(const char* op, const std::vector<at::Tensor>& dsts,
    const std::vector<at::Tensor>& srcs) {
  check_pairs(op, dsts, srcs);
  c10::DeviceIndex device = -1;
  for (size_t i = 0; i < dsts.size(); ++i) {
    const at::Tensor& d = dsts[i];
    const at::Tensor& s = srcs[i];
    const bool h2d = s.is_cpu() && d.device().type() == kNpu;
    const bool d2h = s.device().type() == kNpu && d.is_cpu();
    TORCH_CHECK(h2d || d2h, op, ": pair ", i, " copies ", s.device(), " -> ", d.device(),
        "; expected host->npu or npu->host");
    const c10::DeviceIndex pair_device = h2d ? d.device().index() : s.device().index();
    TORCH_CHECK(device < 0 || device == pair_device, op, ": pairs span npu:",
        static_cast<int>(device), " and npu:", static_cast<int>(pair_device),
        "; expected one device");
    device = pair_device;
    TORCH_CHECK(byte_size(s) <= bytes_to_storage_end(s) && byte_size(s) <= bytes_to_storage_end(d),
        op, ": pair ", i, " would copy ", byte_size(s), " bytes but the source has ",
        bytes_to_storage_end(s), " and the destination ", bytes_to_storage_end(d),
        " bytes to the end of its storage");
  }
  return device;
}

// A host<->device pair's bytes; in plan mode, those bound for the device only
// when the pair is small (Note [Plan mode]: large work writes nothing).
void raw_copy(const at::Tensor& dst, const at::Tensor& src) {
  const size_t n = byte_size(src);
  if (n > 0 && (dst.is_cpu() || work_runs(n))) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), n);
  }
}

// Bytes a thread takes at a time from a shared foreach copy (Note [A waiting
// host helps]), in whole spans. A claim is an atomic add on a counter that the
// worker and the helping host take turns at, so each claim moves its cache line
// between the cores: at 4 spans of 4 KiB (FSDP2's shards) a claim, that add was
// 15% of the worker's samples under `perf` in back-to-back copies of 1000 such
// pairs. 64 KiB (about 5 us of memmove on this VM) makes it a few percent, and
// still splits a task of 48 such pairs into three claims; large spans go one
// at a time, so that the two threads still share a task of a few big ones.
constexpr size_t kBytesPerClaim = size_t{64} << 10;

int64_t spans_per_claim(size_t spans, size_t nbytes) {
  const size_t mean = spans == 0 ? 1 : std::max<size_t>(1, nbytes / spans);
  return static_cast<int64_t>(std::clamp<size_t>(kBytesPerClaim / mean, 1, std::max<size_t>(1, spans)));
}

// One aclnnForeachCopy task: pairs [begin, end) of the lists.
void launch_chunk(NpuStream& stream, at::TensorList dsts, at::TensorList srcs, size_t begin, size_t end) {
  // Pairs are copied as raw byte spans; building CPU views for them would
  // dominate the host cost.
  struct Span {
    void* dst;
    const void* src;
    size_t nbytes;
  };
  std::vector<Span> spans;
  std::vector<std::pair<at::Tensor, at::Tensor>> general;
  spans.reserve(end - begin);
  size_t nbytes = 0;
  size_t span_bytes = 0;
  for (size_t i = begin; i < end; ++i) {
    const at::Tensor& d = dsts[i];
    const at::Tensor& s = srcs[i];
    TORCH_INTERNAL_ASSERT_DEBUG_ONLY(d.device() == dsts[0].device() && s.device() == d.device() &&
        d.sizes().equals(s.sizes()));
    const size_t n = byte_size(d);
    nbytes += n;
    // The fast route's pairs (can_use_fast_route: one dtype, equal sizes, both dense, strides equal
    // wherever a size is not 1) lie over one byte layout; only a lazy conjugate or negative bit
    // makes the bytes differ from the values.
    if (!d.is_conj() && !s.is_conj() && !d.is_neg() && !s.is_neg()) {
      void* dst_ptr = d.data_ptr();
      const void* src_ptr = s.const_data_ptr();
      if (n > 0 && dst_ptr != src_ptr) {
        spans.push_back(Span{dst_ptr, src_ptr, n});
        span_bytes += n;
      }
    } else {
      general.emplace_back(cpu_alias(d), cpu_alias(s));
    }
  }
  const int64_t grain = spans_per_claim(spans.size(), span_bytes);
  stream.enqueue(
      [spans = std::move(spans), general = std::move(general), grain] {
        // The host helps while it waits: Note [A waiting host helps].
        NpuStream::run_shared(static_cast<int64_t>(spans.size()), grain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            if (work_runs(spans[i].nbytes)) {  // Note [Plan mode]
              std::memmove(spans[i].dst, spans[i].src, spans[i].nbytes);
            }
          }
        });
        for (const auto& [dst, src] : general) {
          if (work_runs(byte_size(dst))) {
            host_copy(dst, src);
          }
        }
      },
      copy_task_us(nbytes), "foreach_copy");
}

}  // namespace

int64_t launch_foreach_copy(at::TensorList dsts, at::TensorList srcs, bool wait, double timeout_s) {
  check_pairs("launch_foreach_copy", dsts, srcs);
  const c10::Device device = dsts[0].device();
  TORCH_CHECK(device.type() == kNpu, "launch_foreach_copy: expected npu tensors, got ", device);
  NpuStream& stream = current_stream(device.index());
  int64_t chunks = 0;
  for (size_t begin = 0; begin < dsts.size(); begin += kSingleForeachOpTensorCount) {
    launch_chunk(stream, dsts, srcs, begin, std::min(dsts.size(), begin + kSingleForeachOpTensorCount));
    ++chunks;
  }
  increment_version(dsts);
  if (wait) {
    stream.synchronize(timeout_s);
  }
  return chunks;
}

void memcpy_batch(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs, double timeout_s) {
  const c10::DeviceIndex device = check_batch("memcpy_batch", dsts, srcs);
  // The blocking memcpy bypasses the stream: earlier work on it must be done.
  current_stream(device).synchronize(timeout_s);
  for (size_t i = 0; i < dsts.size(); ++i) {
    raw_copy(dsts[i], srcs[i]);
  }
  increment_version(dsts);
}

void memcpy_batch_async(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs) {
  const c10::DeviceIndex device = check_batch("memcpy_batch_async", dsts, srcs);
  std::vector<at::Tensor> staged = stage_pageable_sources(srcs);
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  pairs.reserve(dsts.size());
  size_t nbytes = 0;
  bool wait = false;
  for (size_t i = 0; i < dsts.size(); ++i) {
    wait = wait || host_must_wait(dsts[i], /*non_blocking=*/true);
    nbytes += byte_size(srcs[i]);
    pairs.emplace_back(cpu_alias(dsts[i]), staged[i]);
  }
  NpuStream& stream = current_stream(device);
  stream.enqueue(
      [pairs = std::move(pairs)] {
        for (const auto& [dst, src] : pairs) {
          raw_copy(dst, src);
        }
      },
      copy_task_us(nbytes), "memcpy_batch_async");
  increment_version(dsts);
  if (wait) {
    stream.synchronize();
  }
}

void launch_delay(c10::DeviceIndex device, double duration_us) {
  TORCH_CHECK(duration_us >= 0.0, "launch_delay: expected a non-negative duration, got ", duration_us, " us");
  current_stream(device).enqueue([] {}, duration_us, "sleep");
}

static_assert(static_cast<int>(c10::ScalarType::NumOptions) <= 63, "ScalarType no longer fits a mask");

int64_t dtype_mask(const std::vector<at::ScalarType>& dtypes) {
  int64_t mask = 0;
  for (const at::ScalarType t : dtypes) {
    mask |= int64_t{1} << static_cast<int>(t);
  }
  return mask;
}

void increment_version(at::TensorList tensors) {
  for (const at::Tensor& t : tensors) {
    t.unsafeGetTensorImpl()->bump_version();
  }
}

}  // namespace npusim
