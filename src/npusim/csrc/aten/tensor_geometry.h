// The geometry of a tensor over a storage, held by value: what a launch
// records of an npu tensor (TensorSnapshot, cpu_aliases.h) and of an output
// its Meta kernel planned (PlannedTensor, launch/meta_cache.h), and what a
// CPU alias or an npu output is made with.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <cstdint>

namespace npusim {

struct TensorGeometry {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;  // in elements, from the storage's start
  bool conj = false;
  bool neg = false;

  static TensorGeometry of(const at::Tensor& t) {
    TensorGeometry g;
    g.dtype = t.scalar_type();
    g.sizes.assign(t.sizes().begin(), t.sizes().end());
    g.strides.assign(t.strides().begin(), t.strides().end());
    g.offset = t.storage_offset();
    g.conj = t.is_conj();
    g.neg = t.is_neg();
    return g;
  }

  // Whether `t` has this geometry at `data` (the address of its storage's start).
  bool describes(const at::Tensor& t, const void* data) const {
    return t.data_ptr() == static_cast<const char*>(data) + offset * static_cast<int64_t>(c10::elementSize(dtype)) &&
        t.sizes().equals(sizes) && t.strides().equals(strides) && t.scalar_type() == dtype &&
        t.is_conj() == conj && t.is_neg() == neg;
  }

  // Gives `impl` (a TensorImpl over the storage, of this dtype) these sizes,
  // strides, offset and conj / neg bits.
  void apply_to(c10::TensorImpl* impl) const {
    impl->set_sizes_and_strides(sizes, strides, offset);
    if (conj) {
      impl->_set_conj(true);
    }
    if (neg) {
      impl->_set_neg(true);
    }
  }
};

}  // namespace npusim
