// The one home of the rules for moving bytes between host and device memory.
//
// Device memory is host memory, so every copy route (copy_, the foreach fast
// path, the batched memcpy) and the fallback come down to the same questions,
// answered here once: how many bytes a tensor spans, whether two tensors have
// the same byte layout (so a memmove is a correct copy), how to see device
// memory as a CPU tensor, how to keep a pageable host source's bytes for a
// queued copy, and when the host has to wait for a copy it queued.
#pragma once

#include "../runtime/npu_type.h"

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <vector>

namespace npusim {

// ---- byte counts and layouts ----------------------------------------------

// numel * element size: the bytes a dense tensor spans from data_ptr().
size_t byte_size(const at::Tensor& t);

// Bytes reachable from data_ptr() to the end of the storage.
size_t bytes_to_storage_end(const at::Tensor& t);

// True when copying src's byte span over dst's byte span gives dst == src
// element by element: one dtype, no conjugate or negative bit, and either the
// same sizes and strides over dense non-overlapping memory, or both
// contiguous with the same numel.
bool same_byte_layout(const at::Tensor& dst, const at::Tensor& src);

// same_byte_layout for every pair of two equally long lists.
bool same_byte_layouts(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs);

// ---- tensors over storages -------------------------------------------------

// A tensor with `like`'s dtype, sizes, strides, offset and conjugate /
// negative bits over `storage`, with dispatch keys `keys`: the one builder
// of CPU views of device memory and of device tensors over adopted memory.
at::Tensor tensor_over(c10::Storage storage, c10::DispatchKeySet keys, const at::Tensor& like);

// A non-owning CPU storage over the bytes of a device storage; resizable
// with the CPU allocator so that out= kernels may grow it (the caller then
// moves the new bytes back to the device).
c10::Storage cpu_storage_over(const c10::Storage& device_storage);

// A CPU tensor over the same bytes as `t` (an npu or CPU tensor), through a
// given CPU storage (several views of one device storage then share one CPU
// storage, as kernels checking overlap expect) or a fresh non-owning one. Its
// lifetime does not keep the memory alive; see Note [Stream-ordered free] for
// why queued work may still use it safely.
at::Tensor cpu_alias_over(const at::Tensor& t, const c10::Storage& cpu_storage);
at::Tensor cpu_alias(const at::Tensor& t);

// ---- host memory -------------------------------------------------------------

// Host memory that is not pinned: a queued copy may not read or write it
// later, because its owner may reuse or free it as soon as the call returns.
bool is_pageable(const at::Tensor& t);

// Whether a host<->device copy into `dst` must complete before the call
// returns: always when the caller did not ask for non_blocking, and for a
// pageable host destination anyway (as the CUDA driver does).
bool host_must_wait(const at::Tensor& dst, bool non_blocking);

// CPU tensors a queued copy reads its sources from: pinned host and device
// sources as themselves (their CPU aliases), pageable host sources as copies
// taken now, all in one pinned staging block for the whole list.
std::vector<at::Tensor> stage_pageable_sources(const std::vector<at::Tensor>& srcs);

// ---- copying ---------------------------------------------------------------------

// Copies src into dst (CPU tensors, possibly over device memory) with
// PyTorch's CPU copy; a memmove when the layouts match.
void host_copy(const at::Tensor& dst_cpu, const at::Tensor& src_cpu);

}  // namespace npusim
