// Whether an op writes a tensor whose memory its kernel refuses to write: see
// Note [Written tensors that overlap].
#pragma once

#include "../op_arguments.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <optional>

namespace npusim {

// Note [Written tensors that overlap]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A written tensor (an out= argument, an in-place op's self) that partially
// overlaps one the op reads (`torch.exp(x[:-1], out=x[1:])`, `x[1:].add_(x[:-1])`)
// or overlaps itself (an expanded tensor) is refused by CPU's TensorIterator
// and by most other kernels when they run ("unsupported operation: some
// elements of the input tensor and the written-to tensor refer to a single
// memory location"); CUDA's launch refuses it from the call. The Meta kernel
// cannot tell, as Meta tensors have no memory, so a stream task failed the
// device: 106 of op_db's out= ops did with a partially overlapping out=
// tensor, every op a stream task. Such a call now runs on the host after the
// stream's earlier work, where CPU's kernel raises its error from the call, or
// computes what it computes with these tensors (the few kernels that allow
// it); a capture still records it. The test is PyTorch's own
// (at::get_overlap_status, at::has_internal_overlap): tensors that are not
// non-overlapping and dense are "too hard" to tell and left to the task, as
// CPU's kernels leave them. It costs the launch of an op that writes a few
// flag reads and one storage compare per read tensor, and nothing more unless
// a written tensor and a read one share storage.

inline bool overlaps_partially(const at::Tensor& written, const at::Tensor& read) {
  // get_overlap_status compares the storages (no copy of either) before any address.
  return written.defined() && read.defined() &&
      at::get_overlap_status(written, read) == at::MemOverlapStatus::Partial;
}
inline bool overlaps_partially(const at::Tensor& written, const std::optional<at::Tensor>& read) {
  return read.has_value() && overlaps_partially(written, *read);
}
inline bool overlaps_partially(const at::Tensor& written, c10::ArrayRef<at::Tensor> read) {
  for (const at::Tensor& r : read) {
    if (overlaps_partially(written, r)) {
      return true;
    }
  }
  return false;
}
template <class T>
bool overlaps_partially(const at::Tensor&, const T&) {
  return false;  // a value argument
}

inline bool overlaps_itself(const at::Tensor& written) {
  return written.defined() && at::has_internal_overlap(written) == at::MemOverlap::Yes;
}

// An in-place op's `self` against the op's other arguments (the unboxed launch).
template <class... Rest>
bool self_overlaps(const at::Tensor& self, const Rest&... rest) {
  return overlaps_itself(self) || (overlaps_partially(self, rest) || ...);
}

// A boxed call's written arguments (uses[i] == kWritten for stack[first + i])
// against its read ones.
inline bool written_overlap(const torch::jit::Stack& stack, size_t first, c10::ArrayRef<ArgUse> uses) {
  const auto tensors_of = [](const c10::IValue& v, auto&& fn) {
    if (v.isTensor()) {
      return fn(v.toTensor());
    }
    if (v.isTensorList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (fn(e.toTensor())) {
          return true;
        }
      }
    }
    return false;
  };
  for (size_t w = 0; w < uses.size(); ++w) {
    if (uses[w] != ArgUse::kWritten) {
      continue;
    }
    const bool overlap = tensors_of(stack[first + w], [&](const at::Tensor& written) {
      if (overlaps_itself(written)) {
        return true;
      }
      for (size_t r = 0; r < uses.size(); ++r) {
        if (uses[r] != ArgUse::kWritten &&
            tensors_of(stack[first + r], [&](const at::Tensor& read) { return overlaps_partially(written, read); })) {
          return true;
        }
      }
      return false;
    });
    if (overlap) {
      return true;
    }
  }
  return false;
}

}  // namespace npusim
