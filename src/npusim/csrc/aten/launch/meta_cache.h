// What an op's Meta kernel said about its outputs, cached per operator and
// argument signature (meta_cache.cpp). See Note [Cached output metadata].
#pragma once

#include "../tensor_geometry.h"

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace npusim {

// An op's arguments as the words its Meta kernel's answer can depend on:
// every tensor's dtype, geometry, storage sharing and bits, every other
// argument's value. Built during the argument walk; not every argument kind
// has words (then the call is not cached).
class MetaKey {
 public:
  void begin(const void* op) {
    words_.clear();
    cacheable_ = true;
    add(reinterpret_cast<intptr_t>(op));
  }
  void add(int64_t word) {
    words_.push_back(word);
  }
  void add(c10::IntArrayRef values) {
    add(static_cast<int64_t>(values.size()));
    words_.append(values.begin(), values.end());
  }
  void add_string(std::string_view s);
  // An npu tensor (its storage group: the index of the first argument tensor on its storage).
  void add_npu_tensor(const at::Tensor& t, int32_t group);
  // A CPU tensor the kernel reads as it is (a scalar or an index).
  void add_host_tensor(const at::Tensor& t);
  // An argument with no words: the call is not cached.
  void uncacheable() {
    cacheable_ = false;
  }
  bool cacheable() const {
    return cacheable_;
  }
  c10::ArrayRef<int64_t> words() const {
    return words_;
  }

 private:
  c10::SmallVector<int64_t, 64> words_;
  bool cacheable_ = true;
};

// One output of the op as the Meta kernel gave it.
struct PlannedTensor {
  enum class Kind : uint8_t {
    kUndefined,
    kArgument,  // an npu argument itself (in-place and out= ops): index into the argument tensors
    kView,      // a view of an argument's storage: index is the storage group
    kFresh,     // new memory: index into MetaPlan::fresh_nbytes
  };
  Kind kind = Kind::kUndefined;
  int32_t index = -1;
  TensorGeometry geometry;
};

struct MetaPlan {
  // The op cannot be launched with these arguments (its Meta kernel failed:
  // no Meta kernel, a data-dependent shape, or arguments the op rejects);
  // it runs on the host, whose CPU kernel then raises any real error.
  bool host_only = false;
  // An out= tensor has another dtype than the op's result (Note [out= tensors
  // of another dtype], op_launch.cpp): launched eagerly, the op runs on the host.
  bool outs_of_another_dtype = false;
  std::vector<PlannedTensor> outputs;  // in return order, lists flattened
  c10::SmallVector<int32_t, 4> list_sizes;  // per return: -1 a tensor (or None), n a list of n
  c10::SmallVector<size_t, 4> fresh_nbytes;  // per fresh storage
  // The timing model's compute cost of the op with these arguments (the cost
  // hook's answer for epoch `cost_epoch`; 0: none yet): a cached plan is asked
  // again only when the model or the profile changed (Note [Chip clock]).
  mutable double duration_us = 0.0;
  mutable uint64_t cost_epoch = 0;
};

// This thread's cached plan for `key`, or null.
const MetaPlan* find_meta_plan(const MetaKey& key);
// Caches `plan` for `key` on this thread and returns the cached copy.
const MetaPlan* store_meta_plan(const MetaKey& key, MetaPlan plan);
// How many answers the calling thread's cache holds.
size_t cached_meta_plans();

}  // namespace npusim
