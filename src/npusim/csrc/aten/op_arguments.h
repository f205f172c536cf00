// The one walk over an op's boxed arguments and the CUDA device rules it
// applies. An op run on the host (fallback_call.h: FallbackCall) and an op
// launched as a stream task or recorded by a graph capture (launch_args.h:
// LaunchArgs) are held to the same rules.
#pragma once

#include "../runtime/device.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace npusim {

// Note [Device rules of the fallback]
// CPU kernels accept any CPU tensor, so without a check a CPU tensor given
// to an npu op would be computed on (or, as a result, adopted as device
// memory). npu follows CUDA instead (see Note [npu follows CUDA where CPU
// differs] in cuda_semantics.cpp): the tensors of one op are on one npu,
// except that a CPU 0-dim tensor may be read as a scalar (TensorIterator's
// rule) and indices (Tensor?[] of index / index_put_) may be on CPU (CUDA's
// indexing moves them); anything else raises CUDA's "Expected all tensors
// to be on the same device" before the kernel runs, so an out= tensor on the
// wrong device is never written. A result over a caller's CPU tensor is
// copied, never adopted: its memory belongs to the caller. A capture applies
// the same rules when it records the op (Note [NPU graph capture]).

// How an op uses a tensor argument.
enum class ArgUse { kRead, kWritten, kIndex };

// Written-to arguments (out=, self of an in-place op) per the schema.
inline ArgUse use_of(const c10::Argument& arg) {
  return arg.alias_info() != nullptr && arg.alias_info()->isWrite() ? ArgUse::kWritten : ArgUse::kRead;
}

// Whether a schema argument is a `Generator?`: random ops get a CPU generator
// seeded from the npu one there (cpu_generator_argument).
inline bool is_optional_generator(const c10::Argument& arg) {
  // castRaw: no shared_ptr copy (an atomic increment) per argument per op.
  const auto* opt = arg.type()->castRaw<c10::OptionalType>();
  return opt != nullptr && opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

// The device rules over the arguments of one call, in argument order.
class DeviceRules {
 public:
  explicit DeviceRules(const c10::OperatorHandle& op) : op_(op) {}

  // Admits tensor `t` used as `use`: true for an npu tensor (it needs an
  // npu stand-in), false for one the kernel takes as it is (undefined, a CPU
  // scalar read as a value, a CPU index). Raises CUDA's error otherwise.
  bool admit(const at::Tensor& t, ArgUse use) {
    if (!t.defined()) {
      return false;
    }
    if (t.device().type() != kNpu) {
      // CPU scalars (0-dim) are read as values, as CUDA's TensorIterator
      // does, and CPU indices are moved by CUDA's indexing kernels.
      const bool accepted = t.is_cpu() && ((use == ArgUse::kRead && t.dim() == 0) || use == ArgUse::kIndex);
      if (!accepted) {
        admit_device(t.device());
      }
      return false;
    }
    admit_device(t.device());
    return true;
  }

  // Admits a device argument (an npu device with index -1 is the current one).
  void admit_device(c10::Device d) {
    if (d.type() == kNpu && d.index() < 0) {
      d = c10::Device(kNpu, current_device());
    }
    if (!first_device_) {
      first_device_ = d;
    }
    if (d.type() == kNpu && device_ < 0) {
      device_ = d.index();
    }
    TORCH_CHECK(d == *first_device_,
        "Expected all tensors to be on the same device, but found at least two devices, ",
        *first_device_, " and ", d, "! (when running ", op_.schema().operator_name(), ")");
  }

  // The op's npu (the current one when no argument names one).
  c10::DeviceIndex device() const {
    return device_ < 0 ? current_device() : device_;
  }
  // Whether any argument is an npu tensor or device.
  bool on_npu() const {
    return device_ >= 0;
  }
  const c10::OperatorHandle& op() const {
    return op_;
  }

 private:
  const c10::OperatorHandle& op_;
  std::optional<c10::Device> first_device_;
  c10::DeviceIndex device_ = -1;
};

// Maps boxed argument `v`, used as `use`: each tensor, alone or in a list,
// becomes map.tensor(t, use) (the elements of a Tensor?[] are indices), an
// npu device becomes map.device(d), anything else stays as it is. Lists are
// read through `v`, which the caller keeps alive for the call.
template <class Map>
c10::IValue map_argument(const c10::IValue& v, ArgUse use, Map& map) {
  if (v.isTensor()) {
    return map.tensor(v.toTensor(), use);
  }
  if (v.isTensorList()) {
    const c10::List<at::Tensor> in = v.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      out.push_back(map.tensor(in.get(i), use));
    }
    return out;
  }
  if (v.isOptionalTensorList()) {
    const c10::List<std::optional<at::Tensor>> in = v.toOptionalTensorList();
    c10::List<std::optional<at::Tensor>> out;
    out.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      const std::optional<at::Tensor> t = in.get(i);
      out.push_back(t.has_value() ? std::optional<at::Tensor>(map.tensor(*t, ArgUse::kIndex)) : std::nullopt);
    }
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == kNpu) {
    return map.device(v.toDevice());
  }
  return v;
}

// The generator a CPU kernel of a random op draws from for a `Generator?`
// argument: a CPU generator seeded from the npu generator's Philox state
// (Note [npu Philox stream]), never the CPU default generator. Generators of
// the wrong device type get CUDA's errors. (generator.cpp)
at::Generator cpu_generator_argument(const c10::IValue& arg, const DeviceRules& rules);

}  // namespace npusim
