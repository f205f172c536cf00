// The one scan of an op's arguments that decides where it runs: the npu it
// runs on, how many elements its npu tensor arguments hold and whether one
// is complex32. The boxed launch (op_launch.cpp: launch_boxed, over the
// stack) and the unboxed one (unboxed_launch.h: UnboxedFallback::call, over
// its typed arguments) both fill one and ask compute_on_the_host_now
// (op_launch.h) with it.
#pragma once

#include "../../runtime/device.h"
#include "../../runtime/npu_type.h"
#include "../../runtime/stream.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace npusim {

struct LaunchScan {
  c10::DeviceIndex device = -1;  // the first npu argument's (a tensor's or a Device's); -1: none yet
  int64_t numel = 0;             // the elements of every npu tensor argument, summed
  bool complex_half = false;     // an npu tensor argument is complex32: Note [complex32 on the host]

  void add(const at::Tensor& t) {
    if (t.defined() && t.device().type() == kNpu) {
      if (device < 0) {
        device = t.device().index();
      }
      numel += t.numel();
      complex_half |= t.scalar_type() == at::kComplexHalf;
    }
  }
  void add(const std::optional<at::Tensor>& t) {
    if (t.has_value()) {
      add(*t);
    }
  }
  void add(c10::ArrayRef<at::Tensor> list) {
    for (const at::Tensor& t : list) {
      add(t);
    }
  }
  void add(const c10::Device& d) {
    if (d.type() == kNpu && device < 0) {
      device = d.index();
    }
  }
  void add(const std::optional<c10::Device>& d) {
    if (d.has_value()) {
      add(*d);
    }
  }
  void add(const c10::IValue& v) {
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList() || v.isOptionalTensorList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) {
          add(e.toTensor());
        }
      }
    } else if (v.isDevice()) {
      add(v.toDevice());
    }
  }
  template <class T>
  void add(const T&) {}  // a value argument: no npu data

  // The arguments of a boxed call: stack[first ...].
  void add_stack(const torch::jit::Stack& stack, size_t first) {
    for (size_t i = first; i < stack.size(); ++i) {
      add(stack[i]);
    }
  }

  // The npu the op runs on: its arguments', else the current one.
  c10::DeviceIndex device_or_current() const {
    return device >= 0 ? device : current_device();
  }
  NpuStream& stream() const {
    return current_stream(device_or_current());
  }
};

}  // namespace npusim
