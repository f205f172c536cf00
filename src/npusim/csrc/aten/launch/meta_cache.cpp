// The per-thread cache of Meta kernels' answers: see meta_cache.h.
#include "meta_cache.h"

#include <cstring>

namespace npusim {

// Note [Cached output metadata]
// A launched op needs its outputs' sizes, strides and dtypes before its CPU
// kernel runs (the host allocates them and returns at once), and its Meta
// kernel gives them: wrapping every npu argument in a Meta tensor and running
// the kernel (for add, a TensorIterator) costs about as much as the CPU kernel
// would on a small tensor, on the host thread, for every op. But a Meta
// kernel is a function of what MetaKey records: dtypes, sizes, strides,
// offsets, which arguments share a storage (overlap checks), conjugate and
// negative bits, wrapped numbers, and the values of every other argument; a
// training loop calls each op with the same few signatures over and over.
// Host tensors are recorded by their metadata, not their values: a host
// mask (bool or uint8, more than 0-dim), whose values size the output of
// advanced indexing (x[cpu_mask]), makes the call uncacheable; a cached plan
// of an earlier mask gave the wrong shape, and the kernel then failed on the
// stream (issue 39's conformance sweep).
// One exception: the floating-point scalars of a pointwise _foreach_* op are
// recorded by kind, not value (OpTraits::floating_scalars_by_kind). Its
// per-tensor ops' Meta kernels read only their kinds, and an optimizer hands
// it new values every step (Adam's bias corrections, a scheduled learning
// rate), whose Meta run each time cost more than the kernels: the composite
// that sizes _foreach_addcdiv_ of 6 tensors on Meta takes 2 ms (Python
// decompositions). Integer scalars keep their values: loops hand them few
// distinct values, and keying them by value asks nothing of the Meta
// kernels.
// So each host thread keeps the answers (a MetaPlan) by key, and a call
// whose key is cached allocates its outputs from the plan without building a
// Meta tensor. Failures are cached too (a plan that says "run on the host"),
// so a data-dependent op (nonzero) does not raise inside its Meta kernel
// every time. Not cached: calls whose Meta kernel changed an argument's
// metadata (an out= resize), arguments with no words (anything but tensors,
// numbers, strings, lists of those, devices, generators), and every call
// while the compute-cost hook is installed (it is given the Meta tensors).
// The table is open-addressed, thread-local (no lock) and starts over when
// it is full.

namespace {

constexpr int64_t kNpuTensor = 0x7e5a01;
constexpr int64_t kHostTensor = 0x7e5a02;
constexpr int64_t kString = 0x7e5a03;
constexpr size_t kSlots = 4096;  // a power of two; cleared when 3/4 full

uint64_t hash_words(c10::ArrayRef<int64_t> words) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (const int64_t w : words) {
    h ^= static_cast<uint64_t>(w) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  }
  return h;
}

struct Slot {
  uint64_t hash = 0;
  std::vector<int64_t> words;
  std::unique_ptr<MetaPlan> plan;
};

class PlanTable {
 public:
  PlanTable() : slots_(kSlots) {}

  const MetaPlan* find(c10::ArrayRef<int64_t> words, uint64_t hash) const {
    for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Slot& slot = slots_[i];
      if (!slot.plan) {
        return nullptr;
      }
      if (slot.hash == hash && slot.words.size() == words.size() &&
          std::memcmp(slot.words.data(), words.data(), words.size() * sizeof(int64_t)) == 0) {
        return slot.plan.get();
      }
    }
  }

  const MetaPlan* insert(c10::ArrayRef<int64_t> words, uint64_t hash, MetaPlan plan) {
    if (used_ >= kSlots / 4 * 3) {
      for (Slot& slot : slots_) {
        slot = Slot();
      }
      used_ = 0;
    }
    size_t i = hash & (kSlots - 1);
    while (slots_[i].plan) {
      i = (i + 1) & (kSlots - 1);
    }
    slots_[i].hash = hash;
    slots_[i].words.assign(words.begin(), words.end());
    slots_[i].plan = std::make_unique<MetaPlan>(std::move(plan));
    ++used_;
    return slots_[i].plan.get();
  }

  size_t size() const {
    return used_;
  }

 private:
  std::vector<Slot> slots_;
  size_t used_ = 0;
};

thread_local PlanTable tls_plans;

}  // namespace

void MetaKey::add_string(std::string_view s) {
  add(kString);
  add(static_cast<int64_t>(s.size()));
  for (size_t i = 0; i < s.size(); i += sizeof(int64_t)) {
    int64_t w = 0;
    std::memcpy(&w, s.data() + i, std::min(sizeof(int64_t), s.size() - i));
    add(w);
  }
}

void MetaKey::add_npu_tensor(const at::Tensor& t, int32_t group) {
  add(kNpuTensor);
  add(static_cast<int64_t>(t.scalar_type()) | (static_cast<int64_t>(t.is_conj()) << 8) |
      (static_cast<int64_t>(t.is_neg()) << 9) | (static_cast<int64_t>(group) << 16));
  add(t.sizes());
  words_.append(t.strides().begin(), t.strides().end());
  add(t.storage_offset());
  add(static_cast<int64_t>(t.storage().nbytes()));
}

void MetaKey::add_host_tensor(const at::Tensor& t) {
  // A host mask (bool or uint8, as advanced indexing takes them) decides the
  // Meta kernel's output shape by its values (x[cpu_mask] has one row per
  // true element), which the key does not record: such a call is not cached.
  if (t.dim() > 0 && (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte)) {
    uncacheable();
  }
  add(kHostTensor);
  add(static_cast<int64_t>(t.scalar_type()) |
      (static_cast<int64_t>(t.unsafeGetTensorImpl()->is_wrapped_number()) << 8));
  add(t.sizes());
  words_.append(t.strides().begin(), t.strides().end());
}

const MetaPlan* find_meta_plan(const MetaKey& key) {
  return key.cacheable() ? tls_plans.find(key.words(), hash_words(key.words())) : nullptr;
}

const MetaPlan* store_meta_plan(const MetaKey& key, MetaPlan plan) {
  return tls_plans.insert(key.words(), hash_words(key.words()), std::move(plan));
}

size_t cached_meta_plans() {
  return tls_plans.size();
}

}  // namespace npusim
