// The npu tensors of one op launch: see launch_args.h.
#include "launch_args.h"

#include "../device_hooks.h"
#include "../host_transfer.h"
#include "../../runtime/device_allocator.h"

#include <ATen/core/List.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <typeinfo>

namespace npusim {

int32_t LaunchArgs::tensor(const at::Tensor& t, ArgUse use) {
  if (!rules_.admit(t, use)) {
    if (!t.defined()) {
      key_.add(0x6e20);
      return kUndefinedRef;
    }
    // A CPU scalar or index: the kernel reads it when the task runs, so the
    // task holds it as it is now (a wrapped number, which only the call has
    // seen, as it is; anything else as a copy, as CUDA reads it at launch).
    key_.add_host_tensor(t);
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      held_.push_back(t);
    } else {
      held_.push_back(t.clone());
    }
    return held_ref(held_.size() - 1);
  }
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const int32_t index = static_cast<int32_t>(inputs_.size());
  int32_t group = -1;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g] == storage) {
      group = static_cast<int32_t>(g);
      break;
    }
  }
  if (group < 0) {
    group = static_cast<int32_t>(groups_.size());
    groups_.push_back(storage);
    group_first_.push_back(index);
  }
  key_.add_npu_tensor(t, group);
  written_ = written_ || use == ArgUse::kWritten;
  inputs_.push_back(Input{&t, group, use});
  return index;
}

void LaunchArgs::make_meta() {
  meta_groups_.clear();
  for (const c10::StorageImpl* storage : groups_) {
    meta_groups_.emplace_back(c10::Storage::use_byte_size_t(), storage->nbytes(),
        c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)), c10::GetAllocator(c10::DeviceType::Meta),
        /*resizable=*/true);
  }
  meta_inputs_.clear();
  for (const Input& in : inputs_) {
    meta_inputs_.push_back(tensor_over(c10::Storage(meta_groups_[static_cast<size_t>(in.group)]),
        c10::DispatchKeySet(c10::DispatchKey::Meta), *in.tensor));
  }
}

at::Tensor LaunchArgs::meta(int32_t ref) const {
  if (ref == kUndefinedRef) {
    return at::Tensor();
  }
  if (ref < 0) {
    return held_[static_cast<size_t>(-2 - ref)];
  }
  return meta_inputs_[static_cast<size_t>(ref)];
}

void LaunchArgs::plan_from_meta(const std::vector<c10::IValue>& results, MetaPlan& plan) {
  const auto& schema_args = op_.schema().arguments();
  const bool has_out_args =
      std::any_of(schema_args.begin(), schema_args.end(), [](const c10::Argument& a) { return a.is_out(); });
  for (size_t k = 0; k < inputs_.size(); ++k) {
    const at::Tensor& m = meta_inputs_[k];
    const at::Tensor& device = *inputs_[k].tensor;
    if (!m.sizes().equals(device.sizes()) || !m.strides().equals(device.strides()) ||
        m.storage_offset() != device.storage_offset() || m.storage().nbytes() != device.storage().nbytes()) {
      TORCH_CHECK(inputs_[k].use == ArgUse::kWritten, "its Meta kernel changed an argument it does not write");
      // Note [An in-place op's self keeps its shape]
      // Only out= arguments are resized to the result: an in-place op whose
      // result broadcasts beyond self (x[5, 1].div_(y[5], rounding_mode=
      // "trunc")) is refused by CPU's and CUDA's kernels ("output with shape
      // [5, 1] doesn't match the broadcast shape [5, 5]"), but the Python
      // Meta kernels of some (torch._refs' in-place wrappers of div with a
      // rounding mode, ...) resize self, as an out= tensor is resized, and a
      // launch that applied that resize changed the caller's tensor
      // silently. Such a call runs on the host, where CPU's kernel raises.
      TORCH_CHECK(has_out_args, "its Meta kernel resized ", op_.schema().operator_name(),
          "'s written argument ", device.sizes(), " to ", m.sizes(), ", which only an out= argument may be");
      // An out= argument that is also read (torch.addr(s, v1, v2, out=s)):
      // resized now, before the kernel reads it, the input would change
      // under the kernel, which checks and reads its inputs before it
      // resizes its output. On the host CPU's kernel does both in its order
      // (addr_ itself is checked before: Note [addr_ is in place by identity]).
      for (const Input& other : inputs_) {
        TORCH_CHECK(other.use == ArgUse::kWritten || other.group != inputs_[k].group, "its Meta kernel resized ",
            op_.schema().operator_name(), "'s out= argument ", device.sizes(), " to ", m.sizes(),
            ", which the op also reads");
      }
      updates_.push_back(Update{static_cast<int32_t>(k), m});
      // See Note [Resizing an output during capture].
      const size_t old_nbytes = device.storage().nbytes();
      if (resize_message_.empty() && old_nbytes > 0 && m.storage().nbytes() > old_nbytes) {
        resize_message_ = c10::str(op_.schema().operator_name(), " grows its output argument from ",
            device.sizes(), " to ", m.sizes(), ", whose ", old_nbytes,
            " old bytes a replay would copy from memory the graph does not own,");
      }
    }
  }
  c10::SmallVector<const c10::StorageImpl*, 2> fresh;
  auto plan_tensor = [&](const at::Tensor& m) {
    PlannedTensor p;
    if (!m.defined()) {
      return p;
    }
    TORCH_CHECK(m.device().type() == c10::DeviceType::Meta && m.layout() == c10::kStrided &&
            typeid(*m.unsafeGetTensorImpl()) == typeid(c10::TensorImpl),
        "its Meta kernel returned a ", m.layout(), " tensor on ", m.device(), ", not a strided Meta tensor");
    p.geometry = TensorGeometry::of(m);
    for (size_t k = 0; k < meta_inputs_.size(); ++k) {
      if (meta_inputs_[k].unsafeGetTensorImpl() == m.unsafeGetTensorImpl()) {
        p.kind = PlannedTensor::Kind::kArgument;  // in-place and out= ops return their argument
        p.index = static_cast<int32_t>(k);
        return p;
      }
    }
    const c10::StorageImpl* storage = m.storage().unsafeGetStorageImpl();
    for (size_t g = 0; g < meta_groups_.size(); ++g) {
      if (meta_groups_[g].unsafeGetStorageImpl() == storage) {
        p.kind = PlannedTensor::Kind::kView;
        p.index = static_cast<int32_t>(g);
        return p;
      }
    }
    p.kind = PlannedTensor::Kind::kFresh;
    for (size_t f = 0; f < fresh.size(); ++f) {
      if (fresh[f] == storage) {
        p.index = static_cast<int32_t>(f);
        return p;
      }
    }
    p.index = static_cast<int32_t>(fresh.size());
    fresh.push_back(storage);
    plan.fresh_nbytes.push_back(m.storage().nbytes());
    return p;
  };
  for (const c10::IValue& r : results) {
    if (r.isTensor()) {
      plan.list_sizes.push_back(-1);
      plan.outputs.push_back(plan_tensor(r.toTensor()));
    } else if (r.isTensorList()) {
      const auto list = r.toTensorList();
      plan.list_sizes.push_back(static_cast<int32_t>(list.size()));
      for (size_t j = 0; j < list.size(); ++j) {
        plan.outputs.push_back(plan_tensor(list.get(j)));
      }
    } else if (r.isNone()) {
      plan.list_sizes.push_back(-1);
      plan.outputs.emplace_back();
    } else {
      TORCH_CHECK(false, "its Meta kernel returned a ", r.tagKind(), ", not a tensor");
    }
  }
}

void LaunchArgs::begin_task(TaskTensors& task, const MetaPlan& plan) {
  // An out= resize of the Meta kernel, done on the device tensor now (before
  // the snapshots, so that the kernel sees the final shape and resizes
  // nothing); growing keeps the old bytes in stream order.
  for (const Update& u : updates_) {
    at::Tensor device = *inputs_[static_cast<size_t>(u.input)].tensor;
    const size_t nbytes = u.meta.storage().nbytes();
    if (nbytes > device.storage().nbytes()) {
      resize_storage_bytes(device.storage(), nbytes);
    }
    device.unsafeGetTensorImpl()->set_sizes_and_strides(u.meta.sizes(), u.meta.strides(), u.meta.storage_offset());
  }
  task.device = device();
  fresh_group_base_ = static_cast<int32_t>(groups_.size());
  task.groups = fresh_group_base_ + static_cast<int32_t>(plan.fresh_nbytes.size());
  task.tensors.reserve(inputs_.size() + plan.fresh_nbytes.size());
  for (const Input& in : inputs_) {
    task.tensors.push_back(TensorSnapshot::of(*in.tensor, in.group));
  }
  task.held = std::move(held_);
  fresh_.resize(plan.fresh_nbytes.size());
}

at::Tensor LaunchArgs::output(const PlannedTensor& p, const MetaPlan& plan, TaskTensors& task, int32_t* snapshot) {
  *snapshot = -1;
  auto over = [&](const c10::Storage& storage) {
    auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(p.geometry.dtype));
    p.geometry.apply_to(out.unsafeGetTensorImpl());
    return out;
  };
  switch (p.kind) {
    case PlannedTensor::Kind::kUndefined:
      return at::Tensor();
    case PlannedTensor::Kind::kArgument:
      return *inputs_[static_cast<size_t>(p.index)].tensor;
    case PlannedTensor::Kind::kView:
      return over(inputs_[static_cast<size_t>(group_first_[static_cast<size_t>(p.index)])].tensor->storage());
    case PlannedTensor::Kind::kFresh: {
      c10::Storage& storage = fresh_[static_cast<size_t>(p.index)];
      if (!storage) {
        // From the caching allocator on the current stream (a graph's pool
        // while it captures), as the host would allocate a kernel's output.
        const size_t nbytes = plan.fresh_nbytes[static_cast<size_t>(p.index)];
        storage = c10::Storage(c10::Storage::use_byte_size_t(), nbytes, device_allocator()->allocate(nbytes),
            device_allocator(), /*resizable=*/true);
      }
      at::Tensor out = over(storage);
      *snapshot = static_cast<int32_t>(task.tensors.size());
      task.tensors.push_back(TensorSnapshot::of(out, fresh_group_base_ + p.index));
      return out;
    }
  }
  return at::Tensor();
}

TaskAccess LaunchArgs::access(const TaskTensors& task) const {
  TaskAccess access;
  for (size_t i = 0; i < task.tensors.size(); ++i) {
    const TensorSnapshot& s = task.tensors[i];
    // The snapshots past the arguments are the fresh outputs (output()).
    access.add(s.data, s.nbytes, i >= inputs_.size() || inputs_[i].use == ArgUse::kWritten);
  }
  return access;
}

}  // namespace npusim
