// The launch of one of the hottest routed ops as a stream task without
// boxing (Note [Unboxed fallback kernels], Note [Compute on the stream]): the
// arguments as the dispatcher has them, the outputs' metadata from the op's
// C++ meta function (at::meta::, not the dispatcher's Meta kernel, which
// torch._meta_registrations makes a Python function for most ops), and a task
// that calls the CPU kernel unboxed (its out= variant when it has one).
#pragma once

#include "launch_args.h"
#include "pointwise_parts.h"
#include "../op_traits.h"
#include "../../runtime/stream.h"
#include "../intraop_threads.h"

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Scalar.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace npusim {

// How one unboxed argument kind is walked (key words, device rules), kept by
// the task, and given to the Meta and CPU kernels. Kinds without a rule fail
// to compile: those ops stay boxed.
template <class T>
struct LaunchArg;

template <>
struct LaunchArg<const at::Tensor&> {
  using stored = int32_t;
  using meta_type = at::Tensor;
  static stored walk(LaunchArgs& a, const at::Tensor& t, ArgUse use) {
    return a.tensor(t, use);
  }
  static at::Tensor meta(const LaunchArgs& a, stored ref) {
    return a.meta(ref);
  }
  static at::Tensor cpu(TaskAliases& aliases, stored ref) {
    return aliases.get(ref);
  }
};
template <>
struct LaunchArg<at::Tensor&> : LaunchArg<const at::Tensor&> {};

template <>
struct LaunchArg<const std::optional<at::Tensor>&> {
  using stored = int32_t;
  using meta_type = std::optional<at::Tensor>;
  static stored walk(LaunchArgs& a, const std::optional<at::Tensor>& t, ArgUse use) {
    if (!t.has_value()) {
      a.key().add(0x6e30);
      return kUndefinedRef;
    }
    return a.tensor(*t, use);
  }
  static std::optional<at::Tensor> meta(const LaunchArgs& a, stored ref) {
    return ref == kUndefinedRef ? std::nullopt : std::optional<at::Tensor>(a.meta(ref));
  }
  static std::optional<at::Tensor> cpu(TaskAliases& aliases, stored ref) {
    return ref == kUndefinedRef ? std::nullopt : std::optional<at::Tensor>(aliases.get(ref));
  }
};

inline void add_scalar_words(MetaKey& key, const c10::Scalar& s) {
  if (s.isSymbolic()) {
    key.uncacheable();
    return;
  }
  key.add(0x6e31 + static_cast<int64_t>(s.type()));
  if (s.isComplex()) {
    const c10::complex<double> c = s.toComplexDouble();
    int64_t bits[2];
    std::memcpy(bits, &c, sizeof(bits));
    key.add(bits[0]);
    key.add(bits[1]);
  } else if (s.isFloatingPoint()) {
    const double d = s.toDouble();
    int64_t bits = 0;
    std::memcpy(&bits, &d, sizeof(bits));
    key.add(bits);
  } else {
    key.add(s.toLong());
  }
}

// Arguments kept by value (numbers, dtypes, scalars).
template <class T>
struct ValueArg {
  using stored = std::decay_t<T>;
  using meta_type = stored;
  static stored walk(LaunchArgs& a, const stored& v, ArgUse) {
    if constexpr (std::is_same_v<stored, c10::Scalar>) {
      add_scalar_words(a.key(), v);
    } else if constexpr (std::is_same_v<stored, std::optional<c10::Scalar>>) {
      if (v.has_value()) {
        add_scalar_words(a.key(), *v);
      } else {
        a.key().add(0x6e32);
      }
    } else if constexpr (std::is_same_v<stored, std::optional<at::ScalarType>>) {
      a.key().add(v.has_value() ? static_cast<int64_t>(*v) : -1);
    } else if constexpr (std::is_same_v<stored, double>) {
      int64_t bits = 0;
      std::memcpy(&bits, &v, sizeof(bits));
      a.key().add(bits);
    } else {
      a.key().add(static_cast<int64_t>(v));  // bool, int64_t, ScalarType
    }
    return v;
  }
  static const stored& meta(const LaunchArgs&, const stored& v) {
    return v;
  }
  static const stored& cpu(TaskAliases&, const stored& v) {
    return v;
  }
};
template <>
struct LaunchArg<const c10::Scalar&> : ValueArg<c10::Scalar> {};
template <>
struct LaunchArg<const std::optional<c10::Scalar>&> : ValueArg<std::optional<c10::Scalar>> {};
template <>
struct LaunchArg<std::optional<at::ScalarType>> : ValueArg<std::optional<at::ScalarType>> {};
template <>
struct LaunchArg<at::ScalarType> : ValueArg<at::ScalarType> {};
template <>
struct LaunchArg<bool> : ValueArg<bool> {};
template <>
struct LaunchArg<int64_t> : ValueArg<int64_t> {};
template <>
struct LaunchArg<double> : ValueArg<double> {};

template <>
struct LaunchArg<c10::string_view> {
  using stored = std::string;
  using meta_type = c10::string_view;
  static stored walk(LaunchArgs& a, c10::string_view s, ArgUse) {
    a.key().add_string(std::string_view(s.data(), s.size()));
    return std::string(s.data(), s.size());
  }
  static c10::string_view meta(const LaunchArgs&, const stored& s) {
    return c10::string_view(s);
  }
  static c10::string_view cpu(TaskAliases&, const stored& s) {
    return c10::string_view(s);
  }
};

template <>
struct LaunchArg<at::IntArrayRef> {
  using stored = c10::SmallVector<int64_t, 5>;
  using meta_type = at::IntArrayRef;
  static stored walk(LaunchArgs& a, at::IntArrayRef v, ArgUse) {
    a.key().add(v);
    return stored(v.begin(), v.end());
  }
  static at::IntArrayRef meta(const LaunchArgs&, const stored& v) {
    return v;
  }
  static at::IntArrayRef cpu(TaskAliases&, const stored& v) {
    return v;
  }
};

template <>
struct LaunchArg<at::OptionalIntArrayRef> {
  using stored = std::optional<c10::SmallVector<int64_t, 5>>;
  using meta_type = at::OptionalIntArrayRef;
  static stored walk(LaunchArgs& a, at::OptionalIntArrayRef v, ArgUse) {
    if (!v.has_value()) {
      a.key().add(0x6e33);
      return std::nullopt;
    }
    a.key().add(*v);
    return c10::SmallVector<int64_t, 5>(v->begin(), v->end());
  }
  static at::OptionalIntArrayRef meta(const LaunchArgs&, const stored& v) {
    return v.has_value() ? at::OptionalIntArrayRef(at::IntArrayRef(*v)) : at::OptionalIntArrayRef();
  }
  static at::OptionalIntArrayRef cpu(TaskAliases&, const stored& v) {
    return v.has_value() ? at::OptionalIntArrayRef(at::IntArrayRef(*v)) : at::OptionalIntArrayRef();
  }
};

// The task of an unboxed launch: OutOp (the out= variant, or void) writes the
// output the host allocated; otherwise Op's result is placed there; an
// in-place Op writes its first argument.
template <class Op, class OutOp, class... Args>
struct UnboxedTask : TaskTensors {
  std::tuple<typename LaunchArg<Args>::stored...> args;
  int32_t out = -1;  // the output's snapshot (functional ops)
  const char* name = nullptr;
  // An arithmetic kernel (Note [Pointwise work shared with a waiting host]).
  bool shares_parts = false;

  void run() const {
    if (!this->kernel_runs()) {  // Note [Plan mode]
      if (out >= 0) {
        this->clear_output(out);
      }
      return;
    }
    const KernelScope scope(*this);
    TaskAliases aliases(*this);
    const c10::DispatchKeySet cpu_keys(c10::DispatchKey::CPU);
    std::apply([&](const auto&... stored) {
      // Braces: the aliases are made in argument order.
      std::tuple<decltype(LaunchArg<Args>::cpu(aliases, stored))...> cpu{LaunchArg<Args>::cpu(aliases, stored)...};
      std::apply([&](auto&... a) {
        if constexpr (!std::is_void_v<OutOp>) {
          at::Tensor dst = aliases.get(out);
          run_kernel(cpu_keys, dst, a...);
          aliases.place(dst, out, name);
        } else if (out >= 0) {
          aliases.place(Op::redispatch(cpu_keys, a...), out, name);
        } else {
          at::Tensor none;
          run_kernel(cpu_keys, none, a...);  // an in-place op: it writes its first argument
        }
      }, cpu);
    }, args);
  }

 private:
  // OutOp into `dst`, or the in-place Op (`dst` undefined), over `a`: in parts
  // that a waiting host may take when the kernel is an arithmetic one that
  // splits (Note [Pointwise work shared with a waiting host]), else whole.
  template <class... A>
  void run_kernel(c10::DispatchKeySet cpu_keys, at::Tensor& dst, A&... a) const {
    const int64_t parts = shares_parts && NpuStream::host_may_help() ? parts_of(&dst, a...) : 1;
    if (parts > 1) {
      run_parts(parts, cpu_keys, dst, a...);
    } else if constexpr (!std::is_void_v<OutOp>) {
      OutOp::redispatch(cpu_keys, a..., dst);
    } else {
      Op::redispatch(cpu_keys, a...);
    }
  }

  // The parts of the kernel's tensors (`dst`, the out= output, may be undefined).
  template <class... A>
  static int64_t parts_of(const at::Tensor* dst, const A&... a) {
    c10::SmallVector<const at::Tensor*, 6> tensors{dst};
    auto add = [&](const auto& arg) {
      using T = std::decay_t<decltype(arg)>;
      if constexpr (std::is_same_v<T, at::Tensor>) {
        tensors.push_back(&arg);
      } else if constexpr (std::is_same_v<T, std::optional<at::Tensor>>) {
        if (arg.has_value()) {
          tensors.push_back(&*arg);
        }
      }
    };
    (add(a), ...);
    return pointwise_parts(tensors);
  }

  // Runs the kernel over each part, on this worker and a waiting host (under
  // the worker's thread-local state: below autograd, its dispatch keys).
  template <class... A>
  static void run_parts(int64_t parts, c10::DispatchKeySet cpu_keys, const at::Tensor& dst, const A&... a) {
    NpuStream::run_shared_as_worker(parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        auto part = std::make_tuple(pointwise_part(a, p)...);
        std::apply([&](auto&... q) {
          if constexpr (!std::is_void_v<OutOp>) {
            at::Tensor out_part = pointwise_part(dst, p);
            OutOp::redispatch(cpu_keys, q..., out_part);
          } else {
            Op::redispatch(cpu_keys, q...);
          }
        }, part);
      }
    });
  }
};

// Launches Op (its C++ meta function MetaFn) on the current stream of its npu;
// false when it must take the boxed route (a host run or another plan).
// `result` receives the functional op's output.
template <class Op, class OutOp, class MetaFn, class... Args>
bool launch_unboxed(const c10::OperatorHandle& op, const char* name, const std::array<ArgUse, sizeof...(Args)>& uses,
    at::Tensor* result, Args... args) {
  constexpr bool in_place = std::is_same_v<typename c10::guts::infer_function_traits_t<typename Op::schema>::return_type,
      at::Tensor&>;
  LaunchArgs launch(op);
  auto task = std::make_shared<UnboxedTask<Op, OutOp, Args...>>();
  size_t i = 0;
  task->args = std::tuple<typename LaunchArg<Args>::stored...>{LaunchArg<Args>::walk(launch, args, uses[i++])...};
  const MetaPlan* plan = find_meta_plan(launch.key());
  MetaPlan fresh_plan;
  if (plan == nullptr) {
    try {
      launch.make_meta();
      std::tuple<typename LaunchArg<Args>::meta_type...> metas = std::apply(
          [&](const auto&... stored) {
            return std::tuple<typename LaunchArg<Args>::meta_type...>{LaunchArg<Args>::meta(launch, stored)...};
          },
          task->args);
      at::Tensor out = std::apply([](auto&... m) -> at::Tensor { return MetaFn{}(m...); }, metas);
      launch.plan_from_meta({c10::IValue(out)}, fresh_plan);
    } catch (const std::exception&) {
      fresh_plan = MetaPlan();
      fresh_plan.host_only = true;
    }
    plan = launch.key().cacheable() && !launch.resizes_arguments() ? store_meta_plan(launch.key(), std::move(fresh_plan))
                                                                   : &fresh_plan;
  }
  const auto expected = in_place ? PlannedTensor::Kind::kArgument : PlannedTensor::Kind::kFresh;
  if (plan->host_only || launch.resizes_arguments() || plan->outputs.size() != 1 ||
      plan->outputs[0].kind != expected) {
    return false;
  }
  const c10::DeviceIndex device = launch.device();
  const c10::OptionalDeviceGuard guard(npu_unless_current(device));
  follow_user_intraop_threads();  // Note [Intra-op threads of autograd's npu thread]
  launch.begin_task(*task, *plan);
  if (!in_place) {
    *result = launch.output(plan->outputs[0], *plan, *task, &task->out);
  }
  task->name = name;
  static const bool pointwise = is_pointwise(op);  // Note [A core for the host]
  task->pointwise = pointwise;
  static const bool shares_parts = shares_pointwise_parts(name);
  task->shares_parts = shares_parts;
  NpuStream& stream = current_stream(device);
  // What it reads and writes, for a capture only (Note [Replaying independent tasks at once]).
  const std::optional<TaskAccess> access =
      stream.capture() != nullptr ? std::optional<TaskAccess>(launch.access(*task)) : std::nullopt;
  stream.enqueue([task = std::shared_ptr<const UnboxedTask<Op, OutOp, Args...>>(std::move(task))] { task->run(); },
      0.0, name, TaskKind::kWork, access ? &*access : nullptr);
  return true;
}

}  // namespace npusim
