// CPU tensors over npu memory for the CPU kernels (cpu_aliases.cpp): what an
// npu tensor argument looks like to a kernel, taken from the live tensor (an
// op run on the host) or from a snapshot taken at enqueue (a stream task),
// and the per-thread pool that reuses their TensorImpls. See Note [Reused
// CPU aliases].
#pragma once

#include "tensor_geometry.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>

namespace npusim {

// What a CPU alias is made of: the storage's bytes and the tensor's geometry,
// viewed (not copied) from a live tensor or from a TensorGeometry: valid
// while its source is.
struct AliasSource {
  void* data;
  size_t nbytes;
  c10::ScalarType dtype;
  c10::IntArrayRef sizes;
  c10::IntArrayRef strides;
  int64_t offset;
  bool conj;
  bool neg;
  bool wrapped_number;

  static AliasSource of(const at::Tensor& t);
};

// An npu tensor as an op enqueued now will see it when its task runs: the
// storage's memory at enqueue (the stream-ordered free keeps it from reuse
// until the task ran; Note [Stream-ordered free]) and the tensor's geometry
// at enqueue (the host may restride or resize the tensor meanwhile).
struct TensorSnapshot {
  void* data = nullptr;
  size_t nbytes = 0;
  int32_t group = -1;  // snapshots over one storage share a group (one CPU storage)
  TensorGeometry geometry;

  static TensorSnapshot of(const at::Tensor& t, int32_t group);
  AliasSource source() const {
    return AliasSource{data, nbytes, geometry.dtype, geometry.sizes, geometry.strides, geometry.offset,
        geometry.conj, geometry.neg, false};
  }
};

// A CPU storage over `nbytes` at `data` that does not own them; resizable
// with the CPU allocator so that out= kernels may grow it.
c10::Storage cpu_storage_at(void* data, size_t nbytes);

// A CPU tensor like `src`, over `shared` (the CPU storage another argument of
// the same call already made for the same device storage) or else over a
// CPU storage of its own, from this thread's pool of aliases.
at::Tensor take_cpu_alias(const AliasSource& src, const c10::Storage* shared);

}  // namespace npusim
