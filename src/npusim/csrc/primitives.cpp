#include "primitives.h"

#include "memory.h"
#include "runtime.h"
#include "tensor_alias.h"

#include <ATen/ATen.h>
#include <ATen/native/ForeachUtils.h>

#include <cstring>

namespace npusim {
namespace {

size_t byte_size(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

// Bytes reachable from data_ptr() to the end of the storage.
size_t bytes_to_storage_end(const at::Tensor& t) {
  return t.storage().nbytes() - static_cast<size_t>(t.storage_offset()) * t.element_size();
}

void check_pairs(const char* op, const std::vector<at::Tensor>& dsts,
    const std::vector<at::Tensor>& srcs) {
  TORCH_CHECK(!dsts.empty() && dsts.size() == srcs.size(), op,
      ": expected two non-empty lists of equal length, got ", dsts.size(), " and ", srcs.size());
}

// Pair checks shared by the batched memcpy primitives: host<->device only,
// and every byte read or written lies inside its storage.
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

void raw_copy(const at::Tensor& dst, const at::Tensor& src) {
  const size_t n = byte_size(src);
  if (n > 0) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), n);
  }
}

}  // namespace

void launch_foreach_copy(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs) {
  check_pairs("launch_foreach_copy", dsts, srcs);
  TORCH_CHECK(dsts.size() <= kSingleForeachOpTensorCount,
      "launch_foreach_copy: one task copies at most ", kSingleForeachOpTensorCount,
      " pairs, got ", dsts.size(), "; split the lists first");
  const c10::Device device = dsts[0].device();
  TORCH_CHECK(device.type() == kNpu, "launch_foreach_copy: expected npu tensors, got ", device);
  // Pairs with one dense layout (what the fast route guarantees) are copied as
  // raw byte spans; building CPU views for them would dominate the host cost.
  struct Span {
    void* dst;
    const void* src;
    size_t nbytes;
  };
  std::vector<Span> spans;
  std::vector<std::pair<at::Tensor, at::Tensor>> general;
  spans.reserve(dsts.size());
  size_t nbytes = 0;
  for (size_t i = 0; i < dsts.size(); ++i) {
    const at::Tensor& d = dsts[i];
    const at::Tensor& s = srcs[i];
    TORCH_CHECK(d.device() == device && s.device() == device, "launch_foreach_copy: pair ", i, " is ",
        s.device(), " -> ", d.device(), "; expected every tensor on ", device);
    TORCH_CHECK(d.sizes().equals(s.sizes()), "launch_foreach_copy: pair ", i, " has source shape ",
        s.sizes(), " and destination shape ", d.sizes());
    const size_t n = byte_size(d);
    nbytes += n;
    if (d.dtype() == s.dtype() && d.strides().equals(s.strides()) && !d.is_conj() && !s.is_conj() &&
        !d.is_neg() && !s.is_neg() && d.is_non_overlapping_and_dense()) {
      if (n > 0 && d.data_ptr() != s.data_ptr()) {
        spans.push_back(Span{d.data_ptr(), s.data_ptr(), n});
      }
    } else {
      general.emplace_back(cpu_alias(d), cpu_alias(s));
    }
  }
  current_stream(device.index()).enqueue(
      [spans = std::move(spans), general = std::move(general)] {
        for (const Span& span : spans) {
          std::memmove(span.dst, span.src, span.nbytes);
        }
        for (const auto& [dst, src] : general) {
          host_copy(dst, src);
        }
      },
      copy_task_us(nbytes), "foreach_copy");
}

void memcpy_batch(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs) {
  check_batch("memcpy_batch", dsts, srcs);
  for (size_t i = 0; i < dsts.size(); ++i) {
    raw_copy(dsts[i], srcs[i]);
  }
}

void memcpy_batch_async(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs) {
  const c10::DeviceIndex device = check_batch("memcpy_batch_async", dsts, srcs);
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  size_t nbytes = 0;
  bool wait = false;
  for (size_t i = 0; i < dsts.size(); ++i) {
    at::Tensor src = cpu_alias(srcs[i]);
    if (srcs[i].is_cpu() && !is_pinned_ptr(srcs[i].storage().data())) {
      // Stage the pageable source's bytes now (the caller may reuse it).
      c10::Storage staged(c10::Storage::use_byte_size_t(), byte_size(srcs[i]), pinned_allocator(), false);
      at::Tensor staging = at::empty({0}, src.options()).set_(staged, 0, {srcs[i].numel()}, {1});
      raw_copy(staging, src);
      src = staging;
    }
    wait = wait || (dsts[i].is_cpu() && !is_pinned_ptr(dsts[i].storage().data()));
    nbytes += byte_size(srcs[i]);
    pairs.emplace_back(cpu_alias(dsts[i]), src);
  }
  NpuStream& stream = current_stream(device);
  stream.enqueue(
      [pairs = std::move(pairs)] {
        for (const auto& [dst, src] : pairs) {
          raw_copy(dst, src);
        }
      },
      copy_task_us(nbytes), "memcpy_batch_async");
  if (wait) {
    stream.synchronize();
  }
}

bool can_use_fast_route(const std::vector<at::Tensor>& self, const std::vector<at::Tensor>& src) {
  return at::native::can_use_fast_route(self, src);
}

void check_foreach_api_restrictions(
    const std::vector<at::Tensor>& self, const std::vector<at::Tensor>& src) {
  at::native::check_foreach_api_restrictions(self, src);
}

void increment_version(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    t.unsafeGetTensorImpl()->bump_version();
  }
}

}  // namespace npusim
