// CPU views of device memory: device memory is host memory, so PyTorch's CPU
// kernels can run on it in place through a CPU tensor that aliases it.
#pragma once

#include <ATen/core/Tensor.h>

namespace npusim {

// A CPU tensor over the same bytes, sizes, strides and offset as `t`, with a
// non-owning storage. Its lifetime does not keep the memory alive; see Note
// [Stream-ordered free] for why queued work may still use it safely.
at::Tensor cpu_alias(const at::Tensor& t);

// Same, but over a given CPU storage (so that several views of one device
// storage share one CPU storage, as kernels checking overlap expect).
at::Tensor cpu_alias_over(const at::Tensor& t, const c10::Storage& cpu_storage);

// A non-owning CPU storage over the bytes of a device storage; resizable
// with the CPU allocator so that out= kernels may grow it (the caller then
// moves the new bytes back to the device).
c10::Storage cpu_storage_over(const c10::Storage& device_storage);

// Copies src into dst with PyTorch's CPU copy; memcpy when the layouts match.
void host_copy(const at::Tensor& dst_cpu, const at::Tensor& src_cpu);

}  // namespace npusim
