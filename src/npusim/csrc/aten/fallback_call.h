// One op run by the CPU fallback (fallback.cpp): its npu arguments as CPU
// aliases, the device rules (op_arguments.h, which graph capture walks too),
// the CPU kernel run after the stream's earlier work, and its results as npu
// tensors. The boxed fallback and the unboxed kernels of the hottest ops
// (fallback_routes.cpp) share it.
#pragma once

#include "intraop_threads.h"
#include "op_arguments.h"
#include "../runtime/cpu_allocator.h"
#include "../runtime/stream.h"
#include "../runtime/subnormals.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>

#include <optional>
#include <type_traits>
#include <utility>

namespace npusim {

class FallbackCall {
 public:
  // How an op uses a tensor argument; see Note [Device rules of the fallback].
  using Use = ArgUse;
  static Use use_of(const c10::Argument& arg) {
    return npusim::use_of(arg);
  }

  explicit FallbackCall(const c10::OperatorHandle& op) : op_(op), rules_(op) {}
  FallbackCall(const FallbackCall&) = delete;
  FallbackCall& operator=(const FallbackCall&) = delete;

  // A boxed argument as the CPU kernel takes it; takes the stack's value,
  // which is kept alive for the call.
  c10::IValue to_cpu(c10::IValue&& v, const c10::Argument& arg);
  // A tensor argument that the caller keeps alive for the call, as a CPU
  // tensor over the same memory (a CPU scalar or index as it is).
  at::Tensor alias(const at::Tensor& t, Use use);

  // The op's npu (the current one when no argument names one).
  c10::DeviceIndex device() const {
    return rules_.device();
  }
  // Whether any argument is an npu tensor or device.
  bool on_npu() const {
    return rules_.on_npu();
  }
  const DeviceRules& rules() const {
    return rules_;
  }

  // map_argument's callbacks (to_cpu walks the boxed arguments with them).
  at::Tensor tensor(const at::Tensor& t, Use use) {
    return alias(t, use);
  }
  c10::IValue device(c10::Device d) {
    rules_.admit_device(d);
    return c10::IValue(c10::Device(c10::DeviceType::CPU));
  }

  // Runs `kernel` (the CPU kernel on the aliases) after the current stream's
  // earlier work, with the op's npu current and this thread's CPU
  // allocations served from its memory (Note [CPU kernels allocate device
  // memory]); then moves what out= kernels resized back to the npu tensors.
  template <class Kernel>
  auto run(Kernel&& kernel) {
    follow_user_intraop_threads();  // Note [Intra-op threads of autograd's npu thread]
    const c10::DeviceIndex d = device();
    wait_current_stream_idle(d);
    const c10::OptionalDeviceGuard guard(npu_unless_current(d));
    const CpuAllocationsOnDevice on_device(d);
    const KeepSubnormals keep_subnormals(flush_denormal_bits() != 0 && !converts_to_a_host_value());
    if constexpr (std::is_void_v<decltype(kernel())>) {
      kernel();
      propagate_resizes();
    } else {
      auto out = kernel();
      propagate_resizes();
      return out;
    }
  }

  // A result of the CPU kernel as an npu tensor: the npu argument it
  // aliases, or a fresh npu tensor over its memory.
  at::Tensor back(const at::Tensor& t);
  c10::IValue from_cpu(const c10::IValue& v);

 private:
  // _local_scalar_dense (.item()): its conversion of a device value to a
  // host number follows the host's subnormal setting, as on CUDA, where the
  // host converts the copied value (Note [Subnormals on npu]).
  bool converts_to_a_host_value() const {
    return op_.operator_name().name == "aten::_local_scalar_dense";
  }

  struct StorageEntry {
    c10::StorageImpl* device;  // kept alive by the caller or originals_
    c10::Storage cpu;
    const void* original_data;
    bool written;  // by some argument over it: the kernel may resize it
  };
  struct TensorEntry {
    c10::TensorImpl* device;  // kept alive by the caller or originals_
    at::Tensor cpu;
    bool written;
  };

  void propagate_resizes();

  const c10::OperatorHandle& op_;
  DeviceRules rules_;
  // Boxed calls move the stack's arguments here: they keep the npu tensors
  // (and storages) that the entries below point to alive for the call.
  c10::SmallVector<c10::IValue, 6> originals_;
  c10::SmallVector<const c10::StorageImpl*, 2> callers_;
  c10::SmallVector<StorageEntry, 4> storages_;
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 2> fresh_;
  c10::SmallVector<TensorEntry, 4> tensors_;
};

}  // namespace npusim
