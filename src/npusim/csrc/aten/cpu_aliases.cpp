// CPU aliases of npu tensors for the CPU kernels, and the per-thread pool
// that reuses them.
#include "cpu_aliases.h"

#include <ATen/core/TensorBody.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/InferenceMode.h>

#include <atomic>

namespace npusim {

// Note [Reused CPU aliases]
// Each npu tensor argument needs a CPU TensorImpl and StorageImpl over its
// memory for the CPU kernel; making and destroying them (two allocations,
// the TensorImpl constructor's key-set and contiguity work, the frees) was a
// large part of the fallback's own cost. A thread keeps the aliases of its
// recent calls and resets one that nothing else refers to (use count 1, the
// pool's own) for the next argument: its storage is pointed at the new
// memory and its dtype, sizes, strides, offset and conjugate and negative
// bits are set as a fresh alias's would be (only what differs: the same
// tensors tend to come back with the same shapes). An alias that something
// still holds, that Python has seen, whose metadata was frozen, or of the
// other inference mode is left alone, and a fresh one is made. The host
// thread's pool serves the ops it runs itself; each stream worker has its
// own for the tasks it runs (their aliases are made from snapshots when the
// task starts and dropped when it ends, so the worker's pool always reuses).

AliasSource AliasSource::of(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return AliasSource{storage->mutable_data(), storage->nbytes(), t.scalar_type(), t.sizes(), t.strides(),
      t.storage_offset(), t.is_conj(), t.is_neg(), impl->is_wrapped_number()};
}

TensorSnapshot TensorSnapshot::of(const at::Tensor& t, int32_t group) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  TensorSnapshot s;
  s.data = storage->mutable_data();
  s.nbytes = storage->nbytes();
  s.group = group;
  s.geometry = TensorGeometry::of(t);
  return s;
}

c10::Storage cpu_storage_at(void* data, size_t nbytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(data, c10::Device(c10::DeviceType::CPU)),
      c10::GetCPUAllocator(), /*resizable=*/true);
}

namespace {

at::Tensor fresh_alias(const AliasSource& src, c10::Storage storage) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
      c10::DispatchKeySet(c10::DispatchKey::CPU), c10::scalarTypeToTypeMeta(src.dtype));
  c10::TensorImpl* impl = out.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(src.sizes, src.strides, src.offset);
  if (src.conj) {
    impl->_set_conj(true);
  }
  if (src.neg) {
    impl->_set_neg(true);
  }
  if (src.wrapped_number) {
    impl->set_wrapped_number(true);
  }
  return out;
}

class AliasPool {
 public:
  at::Tensor take(const AliasSource& src, const c10::Storage* shared) {
    if (src.wrapped_number) {
      // Rare on npu (Python numbers become CPU tensors); the flag can only
      // be changed on a 0-dim tensor, so these are not pooled.
      return fresh_alias(src, shared != nullptr ? *shared : cpu_storage_at(src.data, src.nbytes));
    }
    for (at::Tensor& pooled : tensors_) {
      if (reusable(pooled)) {
        reset(pooled, src, shared);
        return pooled;
      }
    }
    at::Tensor fresh = fresh_alias(src, shared != nullptr ? *shared : cpu_storage_at(src.data, src.nbytes));
    if (tensors_.size() < kSize) {
      tensors_.push_back(fresh);
    }
    return fresh;
  }

 private:
  // A foreach task holds an alias per tensor of each list (AdamW's
  // addcdiv_ over 6 parameters holds 18), so a pool of a single op's
  // handful would make most of them fresh; a take scans only until the
  // first free one.
  static constexpr size_t kSize = 32;

  static bool reusable(const at::Tensor& pooled) {
    const c10::TensorImpl* impl = pooled.unsafeGetTensorImpl();
    // A Python object of the alias (a CPU kernel written in Python saw it)
    // may outlive the call with attributes of its own: such an alias is not
    // reused.
    const bool free = pooled.use_count() == 1 && pooled.weak_use_count() == 1 &&
        impl->allow_tensor_metadata_change() && impl->autograd_meta() == nullptr &&
        impl->pyobj_slot()->load_pyobj() == nullptr && pooled.is_inference() == c10::InferenceMode::is_enabled();
    if (free) {
      // Another thread's last use (a stream task that held the alias) happens before our reset.
      std::atomic_thread_fence(std::memory_order_acquire);
    }
    return free;
  }

  // Makes `pooled` an alias of `src`, touching only what differs.
  static void reset(at::Tensor& pooled, const AliasSource& src, const c10::Storage* shared) {
    c10::TensorImpl* impl = pooled.unsafeGetTensorImpl();
    const caffe2::TypeMeta dtype = c10::scalarTypeToTypeMeta(src.dtype);
    if (shared != nullptr) {
      if (impl->storage().unsafeGetStorageImpl() != shared->unsafeGetStorageImpl() || pooled.dtype() != dtype) {
        impl->set_storage_and_dtype(*shared, dtype);
      }
    } else if (impl->storage().use_count() == 1 &&
        impl->storage().unsafeGetStorageImpl()->pyobj_slot()->load_pyobj() == nullptr) {
      // its own storage, which nothing else has seen: point it at the new memory
      c10::StorageImpl* cpu = impl->storage().unsafeGetStorageImpl();
      if (cpu->data_ptr().get() != src.data || cpu->nbytes() != src.nbytes || !cpu->resizable()) {
        cpu->set_data_ptr_noswap(c10::DataPtr(src.data, c10::Device(c10::DeviceType::CPU)));
        cpu->set_nbytes(src.nbytes);
        cpu->set_allocator(c10::GetCPUAllocator());
        cpu->set_resizable(true);
      }
      if (pooled.dtype() != dtype) {
        impl->set_storage_and_dtype(impl->storage(), dtype);
      }
    } else {
      impl->set_storage_and_dtype(cpu_storage_at(src.data, src.nbytes), dtype);
    }
    if (!impl->sizes().equals(src.sizes) || !impl->strides().equals(src.strides) ||
        impl->storage_offset() != src.offset) {
      impl->set_sizes_and_strides(src.sizes, src.strides, src.offset);
    }
    if (pooled.is_conj() != src.conj) {
      impl->_set_conj(src.conj);
    }
    if (pooled.is_neg() != src.neg) {
      impl->_set_neg(src.neg);
    }
  }

  c10::SmallVector<at::Tensor, kSize> tensors_;
};

thread_local AliasPool tls_alias_pool;

}  // namespace

at::Tensor take_cpu_alias(const AliasSource& src, const c10::Storage* shared) {
  return tls_alias_pool.take(src, shared);
}

}  // namespace npusim
