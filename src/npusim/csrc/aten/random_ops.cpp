// npu kernels of the elementwise random ops, drawn from the npu generator's
// Philox stream (Note [npu Philox stream]). Argument checks, shapes and the
// normal.Tensor_* arithmetic come from PyTorch's own DistributionTemplates.h,
// the value transforms from TransformationHelper.h; only the source of the
// random bits is npusim's. Each op takes its Philox state on the host when
// it is launched (so the order of draws is the order of launches) and fills
// the device memory in place as a task on the current stream (Note [Compute
// on the stream]); while the stream is captured the task is recorded and
// reads the graph-safe Philox state when it runs (Note [Graph-safe Philox
// state]), so each replay draws fresh numbers.
#include "generator.h"
#include "../runtime/plan_mode.h"
#include "../runtime/stream.h"
#include "host_transfer.h"
#include "intraop_threads.h"
#include "launch/op_launch.h"
#include "box_muller.h"
#include "philox_blocks.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/core/TransformationHelper.h>
#include <ATen/native/DistributionTemplates.h>
#include <c10/util/MathConstants.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <tuple>

namespace npusim {
namespace {

namespace templates = at::native::templates;
using at::Tensor;
using Gen = std::optional<at::Generator>;

// Elements a thread takes at a time (run_shared); each range seeks the
// Philox stream to its first element. At a few ns per element a claim is
// tens of microseconds, against well under one for the claim itself.
constexpr int64_t kElementsPerClaim = 1 << 12;

// The 128-bit Philox block of one element.
struct PhiloxBlock {
  uint32_t x[4];
  uint64_t lo() const {
    return x[0] | (static_cast<uint64_t>(x[1]) << 32);
  }
  uint64_t hi() const {
    return x[2] | (static_cast<uint64_t>(x[3]) << 32);
  }
};

// [0, 1) with 53 random bits.
double unit(uint64_t v) {
  return static_cast<double>(v >> 11) * 0x1.0p-53;
}

// (0, 1) with 52 random bits: for transforms that take a log of u or 1 - u.
double open_unit(uint64_t v) {
  return (static_cast<double>(v >> 12) + 0.5) * 0x1.0p-52;
}

// A double standard normal: Box-Muller over the block's two halves, 53
// random bits each (float math's, 24 bits each as CUDA's curand_normal4, is
// standard_normal_floats: Note [Box-Muller bit for bit]).
double standard_normal_double(const PhiloxBlock& b) {
  const double radius = std::sqrt(-2.0 * std::log1p(-unit(b.lo())));
  return radius * std::cos(2.0 * c10::pi<double> * unit(b.hi()));
}

c10::DeviceIndex npu_device_of(const Tensor& self, const Gen& gen, const char* op) {
  if (self.device().type() != kNpu) {
    // Only a generator can bring a CPU tensor here (its dispatch key): CUDA's error.
    TORCH_CHECK(!(gen.has_value() && gen->defined()), "Expected a '", self.device().type(),
        "' device type for generator but found '", gen->device().type(), "'");
    TORCH_CHECK(false, op, ": expected self on an npu device, but got ", self.device());
  }
  return self.device().index();
}

// One random op's launch: its Philox state, taken on the host (by value, or
// in a capture where the inputs will be when the task runs), and its name.
struct RandomLaunch {
  PhiloxState state;
  const char* op;
};

// Writes the elements [0, numel) of `out` from the blocks at offset + i (Note
// [npu Philox stream]), kPhiloxBatch blocks at a time (Note [Philox blocks in
// batches]): write(batch, first, count, out + first) writes elements first ..
// first + count - 1 from lanes 0 .. count - 1. Each range starts at its own
// element, so the numbers do not depend on which thread writes which range:
// the stream's worker, and a host that waits for the stream meanwhile (Note
// [A waiting host helps]).
template <typename scalar_t, typename W>
void philox_write_dense(scalar_t* out, int64_t numel, const PhiloxInputs& in, const W& write) {
  NpuStream::run_shared(numel, kElementsPerClaim, [&](int64_t begin, int64_t end) {
    PhiloxBatch batch;
    for (int64_t first = begin; first < end; first += kPhiloxBatch) {
      const int count = static_cast<int>(std::min<int64_t>(kPhiloxBatch, end - first));
      philox_blocks(in.seed, in.offset, static_cast<uint64_t>(first), count, batch);
      write(batch, first, count, out + first);
    }
  });
}

// The batch writer of an element transform: element first + j is
// value(block j, first + j).
template <typename F>
auto each_element(F value) {
  return [value](const PhiloxBatch& batch, int64_t first, int count, auto* out) {
    for (int j = 0; j < count; ++j) {
      const PhiloxBlock b{{batch.x[0][j], batch.x[1][j], batch.x[2][j], batch.x[3][j]}};
      out[j] = value(b, first + j);
    }
  };
}

// The batch writer of a float-math normal_ or log_normal_: each element is
// transform(z) of its block's standard normal z, the lanes' z computed
// together (Note [Box-Muller bit for bit]).
template <typename scalar_t, typename F>
auto each_standard_normal_float(F transform) {
  return [transform](const PhiloxBatch& batch, int64_t, int count, scalar_t* out) {
    float normals[kPhiloxBatch];
    standard_normal_floats(batch, count, normals);
    for (int j = 0; j < count; ++j) {
      out[j] = static_cast<scalar_t>(transform(normals[j]));
    }
  };
}

// Runs `fill` (which writes the op's output from the Philox inputs it is
// given) in stream order on the current stream of `device`: in place on the
// host when the stream is idle and the op is small, as other compute ops
// (compute_on_the_host_now, Note [Work on an idle stream]), else as a task
// (Note [Compute on the stream]), which in a capture reads the graph-safe
// state when it runs. `fill` is copied into the task.
template <typename Fill>
void run_random_op(c10::DeviceIndex device, int64_t numel, size_t device_bytes, const RandomLaunch& launch, Fill fill) {
  NpuStream& stream = current_stream(device);
  if (compute_on_the_host_now(stream, numel)) {
    fill(launch.state.unpack());
    return;
  }
  stream.enqueue([state = launch.state, numel, runs = work_runs(device_bytes), fill = std::move(fill)] {
    if (!runs) {
      return;  // Note [Plan mode]: the draws are taken (the offset advanced), not written
    }
    // The team of the CPU copy a non-contiguous fill ends with; the draws are
    // split by run_shared, element i from block offset + i whoever writes it.
    apply_user_intraop_threads(numel, /*pointwise=*/true);
    fill(state.unpack());
  }, 0.0, launch.op);
}

// Device memory as the host reads and writes it: the address of an npu
// tensor's first element at launch and the storage that keeps it alive (the
// tensor's metadata may change after the launch; the task uses what was
// launched).
template <typename scalar_t>
struct DeviceSpan {
  c10::Storage storage;
  scalar_t* data;
  int64_t numel;

  explicit DeviceSpan(const Tensor& t)
      : storage(t.storage()), data(static_cast<scalar_t*>(t.data_ptr())), numel(t.numel()) {}
};

// Fills `self`, element i in row-major logical order from the block at
// offset + i, with the batch writer `write` (philox_write_dense) in stream
// order: in place when it is contiguous, else through a dense temporary
// copied into a CPU alias of it. `write` is copied into the task.
template <typename scalar_t, typename W>
void philox_fill_batches(const Tensor& self, const RandomLaunch& launch, W write) {
  const c10::DeviceIndex device = self.device().index();
  if (self.is_contiguous()) {
    run_random_op(device, self.numel(), self.numel() * sizeof(scalar_t), launch, [target = DeviceSpan<scalar_t>(self), write](const PhiloxInputs& in) {
      philox_write_dense(target.data, target.numel, in, write);
    });
    return;
  }
  run_random_op(device, self.numel(), self.numel() * sizeof(scalar_t), launch, [cpu = cpu_alias(self), write](const PhiloxInputs& in) {
    const Tensor dense = at::empty(cpu.sizes(), cpu.options());
    philox_write_dense(dense.data_ptr<scalar_t>(), cpu.numel(), in, write);
    host_copy(cpu, dense);
  });
}

// philox_fill_batches with an element transform: element i is value(block, i).
template <typename scalar_t, typename F>
void philox_fill(const Tensor& self, const RandomLaunch& launch, F value) {
  philox_fill_batches<scalar_t>(self, launch, each_element(std::move(value)));
}

// Fills `self` with transform(z) of each element's standard normal z in the
// op's math type acc_t: float's many lanes at a time (Note [Box-Muller bit
// for bit]), double's one block at a time.
template <typename scalar_t, typename acc_t, typename F>
void philox_fill_normal(const Tensor& self, const RandomLaunch& launch, F transform) {
  if constexpr (std::is_same_v<acc_t, float>) {
    philox_fill_batches<scalar_t>(self, launch, each_standard_normal_float<scalar_t>(std::move(transform)));
  } else {
    philox_fill<scalar_t>(self, launch, [transform](const PhiloxBlock& b, int64_t) {
      return static_cast<scalar_t>(transform(standard_normal_double(b)));
    });
  }
}

// Takes this op's Philox state (the order of launches is the order of draws).
RandomLaunch begin_op(const Tensor& self, const Gen& gen, const char* op) {
  const c10::DeviceIndex device = npu_device_of(self, gen, op);
  // At the call, as CPU's and CUDA's kernels refuse it (their TensorIterator's
  // check): a fill of an expanded tensor on the stream failed the device.
  at::assert_no_internal_overlap(self);
  return RandomLaunch{philox_state(gen, device, static_cast<uint64_t>(self.numel())), op};
}

// ---- kernels, in the shape DistributionTemplates.h calls them ---------------

template <typename RNG>
struct UniformKernel {
  void operator()(at::TensorIteratorBase& iter, double from_, double to_, Gen gen) {
    const Tensor& self = iter.tensor(0);
    const RandomLaunch in = begin_op(self, gen, "uniform_");
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "uniform_npu", [&] {
      const auto from = static_cast<scalar_t>(from_);
      const auto to = static_cast<scalar_t>(to_);
      philox_fill<scalar_t>(self, in, [=](const PhiloxBlock& b, int64_t) {
        const auto value = static_cast<scalar_t>(at::transformation::uniform_real<scalar_t>(b.lo(), from, to));
        // As CUDA: rounding may reach `to`, which [from, to) excludes.
        return value == to ? from : value;
      });
    });
  }
};

template <typename RNG>
struct NormalKernel {
  void operator()(Tensor& self, double mean, double std, Gen gen) {
    const RandomLaunch in = begin_op(self, gen, "normal_");
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "normal_kernel_npu", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const auto m = static_cast<acc_t>(mean);
      const auto s = static_cast<acc_t>(std);
      philox_fill_normal<scalar_t, acc_t>(self, in, [=](acc_t z) {
        return at::transformation::normal(z, m, s);
      });
    });
  }
};

template <typename RNG>
struct LogNormalKernel {
  void operator()(at::TensorIteratorBase& iter, double mean, double std, Gen gen) {
    const Tensor& self = iter.tensor(0);
    const RandomLaunch in = begin_op(self, gen, "log_normal_");
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "log_normal_npu", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const auto m = static_cast<acc_t>(mean);
      const auto s = static_cast<acc_t>(std);
      philox_fill_normal<scalar_t, acc_t>(self, in, [=](acc_t z) {
        return at::transformation::log_normal(at::transformation::normal(z, m, s));
      });
    });
  }
};

template <typename RNG>
struct ExponentialKernel {
  void operator()(at::TensorIteratorBase& iter, double lambda, Gen gen) {
    const Tensor& self = iter.tensor(0);
    TORCH_CHECK(at::isFloatingType(self.scalar_type()),
        "Exponential distribution is a continuous probability distribution. dtype must be a floating point "
        "but you specified ", self.dtype());
    const RandomLaunch in = begin_op(self, gen, "exponential_");
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "exponential_npu", [&] {
      philox_fill<scalar_t>(self, in, [=](const PhiloxBlock& b, int64_t) {
        // u in (0, 1): never 0, as CUDA's exponential_ (a 0 breaks gumbel_softmax's log).
        return static_cast<scalar_t>(at::transformation::exponential(open_unit(b.lo()), lambda));
      });
    });
  }
};

template <typename RNG>
struct GeometricKernel {
  void operator()(at::TensorIteratorBase& iter, double p, Gen gen) {
    const Tensor& self = iter.tensor(0);
    const RandomLaunch in = begin_op(self, gen, "geometric_");
    AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "geometric_npu", [&] {
      philox_fill<scalar_t>(self, in, [=](const PhiloxBlock& b, int64_t) {
        return static_cast<scalar_t>(at::transformation::geometric(open_unit(b.lo()), p));
      });
    });
  }
};

template <typename RNG>
struct CauchyKernel {
  void operator()(at::TensorIteratorBase& iter, double median, double sigma, Gen gen) {
    const Tensor& self = iter.tensor(0);
    const RandomLaunch in = begin_op(self, gen, "cauchy_");
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "cauchy_npu", [&] {
      philox_fill<scalar_t>(self, in, [=](const PhiloxBlock& b, int64_t) {
        return static_cast<scalar_t>(at::transformation::cauchy(open_unit(b.lo()), median, sigma));
      });
    });
  }
};

template <typename RNG>
struct RandomKernel {
  void operator()(at::TensorIteratorBase& iter, Gen gen) {
    const Tensor& self = iter.tensor(0);
    const RandomLaunch in = begin_op(self, gen, "random_");
    AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, self.scalar_type(), "random_kernel_npu", [&] {
      philox_fill<scalar_t>(self, in, [](const PhiloxBlock& b, int64_t) {
        return at::transformation::uniform_int<scalar_t>(b.lo());
      });
    });
  }
};

template <typename RNG>
struct RandomFromToKernel {
  void operator()(at::TensorIteratorBase& iter, uint64_t range, int64_t base, Gen gen) {
    const Tensor& self = iter.tensor(0);
    const RandomLaunch in = begin_op(self, gen, "random_");
    AT_DISPATCH_V2(self.scalar_type(), "random_from_to_kernel_npu", AT_WRAP([&] {
      philox_fill<scalar_t>(self, in, [=](const PhiloxBlock& b, int64_t) {
        return at::transformation::uniform_int_from_to<scalar_t>(b.lo(), range, base);
      });
    }), AT_EXPAND(AT_ALL_TYPES), at::kBool, at::kHalf, at::kBFloat16, AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES));
  }
  // [int64 min, int64 max]: the whole 64-bit range.
  void operator()(at::TensorIteratorBase& iter, Gen gen) {
    const Tensor& self = iter.tensor(0);
    const RandomLaunch in = begin_op(self, gen, "random_");
    AT_DISPATCH_V2(self.scalar_type(), "random_full_64_bits_range_kernel_npu", AT_WRAP([&] {
      philox_fill<scalar_t>(self, in, [](const PhiloxBlock& b, int64_t) {
        return at::transformation::uniform_int_full_range<scalar_t>(b.lo());
      });
    }), at::kLong, at::kDouble, at::kFloat, at::kBFloat16);
  }
};

template <typename RNG>
struct BernoulliScalarKernel {
  void operator()(const Tensor& self, double p, Gen gen) {
    const RandomLaunch in = begin_op(self, gen, "bernoulli_");
    AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, self.scalar_type(), "bernoulli_scalar_npu_", [&] {
      philox_fill<scalar_t>(self, in, [=](const PhiloxBlock& b, int64_t) {
        return static_cast<scalar_t>(at::transformation::bernoulli(unit(b.lo()), p));
      });
    });
  }
};

template <typename RNG>
struct BernoulliTensorKernel {
  void operator()(const Tensor& self, const Tensor& p_, Gen gen) {
    const c10::DeviceIndex device = npu_device_of(self, gen, "bernoulli_");
    // As CUDA, p may live on another device (or the host): it is copied over.
    const Tensor p_dev = p_.device() == self.device() ? p_ : p_.to(self.device());
    // CPU's and CUDA's kernels iterate p and self with a TensorIterator, which refuses this.
    at::assert_no_partial_overlap(self, p_dev);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p_dev.scalar_type(), "bernoulli_tensor_npu_p_", [] {});
    NpuStream& stream = current_stream(device);
    // The probabilities, as doubles of self's shape, checked to lie in [0, 1].
    auto probs = std::make_shared<Tensor>();
    if (stream.capture() == nullptr) {
      // The host checks them (the error is raised at the call, as on CPU), so
      // it waits for them: Note [Compute on the stream].
      wait_current_stream_idle(device);
      *probs = probabilities(cpu_alias(p_dev), self.sizes());
    } else {
      // In a capture p is read (and checked) by a recorded task before the fill.
      stream.enqueue([probs, p = cpu_alias(p_dev), sizes = self.sizes().vec()] {
        *probs = probabilities(p, sizes);
      }, 0.0, "bernoulli_");
    }
    const RandomLaunch in = begin_op(self, gen, "bernoulli_");
    AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, self.scalar_type(), "bernoulli_tensor_npu_self_", [&] {
      philox_fill<scalar_t>(self, in, [=](const PhiloxBlock& b, int64_t i) {
        // the probabilities (host memory) live as long as the task
        return static_cast<scalar_t>(at::transformation::bernoulli(unit(b.lo()), probs->const_data_ptr<double>()[i]));
      });
    });
  }

  static Tensor probabilities(const Tensor& p_cpu, c10::IntArrayRef sizes) {
    const Tensor p = p_cpu.expand(sizes).to(at::kDouble).contiguous();
    const double* values = p.const_data_ptr<double>();
    for (int64_t i = 0; i < p.numel(); ++i) {
      TORCH_CHECK(values[i] >= 0 && values[i] <= 1,
          "bernoulli_: expected every element of p in [0, 1], but got p=", values[i], " at flat index ", i);
    }
    return p;
  }
};

// ---- the aten entry points ----------------------------------------------------

using RNG = NpuGeneratorImpl;

Tensor& uniform_(Tensor& self, double from, double to, Gen gen) {
  return templates::uniform_impl_<UniformKernel, RNG>(self, from, to, gen);
}

Tensor& normal_(Tensor& self, double mean, double std, Gen gen) {
  return templates::normal_impl_<NormalKernel, RNG>(self, mean, std, gen);
}

Tensor normal_tensor_float(const Tensor& mean, double std, Gen gen) {
  return templates::normal_impl<NormalKernel, RNG>(mean, std, gen);
}

Tensor& normal_tensor_float_out(const Tensor& mean, double std, Gen gen, Tensor& out) {
  return templates::normal_out_impl<NormalKernel, RNG>(out, mean, std, gen);
}

Tensor normal_float_tensor(double mean, const Tensor& std, Gen gen) {
  return templates::normal_impl<NormalKernel, RNG>(mean, std, gen);
}

Tensor& normal_float_tensor_out(double mean, const Tensor& std, Gen gen, Tensor& out) {
  return templates::normal_out_impl<NormalKernel, RNG>(out, mean, std, gen);
}

Tensor normal_tensor_tensor(const Tensor& mean, const Tensor& std, Gen gen) {
  return templates::normal_impl<NormalKernel, RNG>(mean, std, gen);
}

Tensor& normal_tensor_tensor_out(const Tensor& mean, const Tensor& std, Gen gen, Tensor& out) {
  return templates::normal_out_impl<NormalKernel, RNG>(out, mean, std, gen);
}

Tensor& log_normal_(Tensor& self, double mean, double std, Gen gen) {
  return templates::log_normal_impl_<LogNormalKernel, RNG>(self, mean, std, gen);
}

Tensor& exponential_(Tensor& self, double lambda, Gen gen) {
  return templates::exponential_impl_<ExponentialKernel, RNG>(self, lambda, gen);
}

Tensor& geometric_(Tensor& self, double p, Gen gen) {
  return templates::geometric_impl_<GeometricKernel, RNG>(self, p, gen);
}

Tensor& cauchy_(Tensor& self, double median, double sigma, Gen gen) {
  return templates::cauchy_impl_<CauchyKernel, RNG>(self, median, sigma, gen);
}

Tensor& random_(Tensor& self, Gen gen) {
  return templates::random_impl<RandomKernel, RNG>(self, gen);
}

Tensor& random_from(Tensor& self, int64_t from, std::optional<int64_t> to, Gen gen) {
  return templates::random_from_to_impl<RandomFromToKernel, RNG>(self, from, to, gen);
}

Tensor& random_to(Tensor& self, int64_t to, Gen gen) {
  return random_from(self, 0, to, gen);
}

Tensor& bernoulli_float(Tensor& self, double p, Gen gen) {
  return templates::bernoulli_impl_<BernoulliScalarKernel, RNG>(self, p, gen);
}

Tensor& bernoulli_tensor(Tensor& self, const Tensor& p, Gen gen) {
  return templates::bernoulli_impl_<BernoulliTensorKernel, RNG>(self, p, gen);
}

Tensor& bernoulli_out(const Tensor& self, Gen gen, Tensor& out) {
  return templates::bernoulli_out_impl<BernoulliTensorKernel, RNG>(out, self, gen);
}

// Note [npu native_dropout]
// CPU's native_dropout kernel draws its mask from the CPU default generator
// and returns a mask of the input's dtype; npu follows CUDA: the mask is bool
// and comes from the npu generator (a bernoulli_ of 1 - p over the mask's
// elements, so it advances the offset by numel as DTensor's tracker
// expects), and the output is input * mask * (1 / (1 - p)), the scale
// applied in the op's math type. For a contiguous floating-point input one
// pass draws each element's block and writes its mask bit and its output,
// computing exactly what the three ops (bernoulli_, mul, mul_) computed
// before: (x * m) * scale, so a dropped NaN or inf stays NaN as on CUDA.
// Other inputs (strided, integer, float8, complex) take those three ops.
std::tuple<Tensor, Tensor> native_dropout(const Tensor& input, double p, std::optional<bool> train) {
  const auto mask_options = input.options().dtype(at::kBool);
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, mask_options)};
  }
  if (p == 1) {
    return {at::zeros_like(input), at::zeros_like(input, mask_options)};
  }
  Tensor mask = at::empty_like(input, mask_options);
  const at::ScalarType dtype = input.scalar_type();
  const bool one_pass_dtype =
      dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16;
  if (input.device().type() != kNpu || !input.is_contiguous() || !one_pass_dtype) {
    bernoulli_float(mask, 1 - p, std::nullopt);
    return {input.mul(mask).mul_(1.0 / (1.0 - p)), mask};
  }
  Tensor output = at::empty_like(input, at::MemoryFormat::Contiguous);  // mask is contiguous as input is
  // bernoulli_'s checks and its draw, over the mask
  TORCH_CHECK(0 <= p && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  const RandomLaunch launch = begin_op(mask, std::nullopt, "native_dropout");
  const double keep = 1 - p;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "native_dropout_npu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const auto scale = static_cast<opmath_t>(1.0 / keep);
    run_random_op(input.device().index(), input.numel(), input.numel() * (2 * sizeof(scalar_t) + 1), launch,
        [x = DeviceSpan<scalar_t>(input), out = DeviceSpan<scalar_t>(output), m = DeviceSpan<bool>(mask), keep,
         scale](const PhiloxInputs& in) {
          // all three contiguous, of one shape: element i of each is at offset i
          const scalar_t* source = x.data;
          scalar_t* target = out.data;
          philox_write_dense(m.data, m.numel, in, each_element([&](const PhiloxBlock& b, int64_t i) {
            const bool kept = at::transformation::bernoulli(unit(b.lo()), keep);
            const auto dropped = static_cast<scalar_t>(source[i] * static_cast<scalar_t>(kept));
            target[i] = static_cast<scalar_t>(static_cast<opmath_t>(dropped) * scale);
            return kept;
          }));
        });
  });
  return {output, mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("uniform_", TORCH_FN(uniform_));
  m.impl("normal_", TORCH_FN(normal_));
  m.impl("normal.Tensor_float", TORCH_FN(normal_tensor_float));
  m.impl("normal.Tensor_float_out", TORCH_FN(normal_tensor_float_out));
  m.impl("normal.float_Tensor", TORCH_FN(normal_float_tensor));
  m.impl("normal.float_Tensor_out", TORCH_FN(normal_float_tensor_out));
  m.impl("normal.Tensor_Tensor", TORCH_FN(normal_tensor_tensor));
  m.impl("normal.Tensor_Tensor_out", TORCH_FN(normal_tensor_tensor_out));
  m.impl("log_normal_", TORCH_FN(log_normal_));
  m.impl("exponential_", TORCH_FN(exponential_));
  m.impl("geometric_", TORCH_FN(geometric_));
  m.impl("cauchy_", TORCH_FN(cauchy_));
  m.impl("random_", TORCH_FN(random_));
  m.impl("random_.from", TORCH_FN(random_from));
  m.impl("random_.to", TORCH_FN(random_to));
  m.impl("bernoulli_.float", TORCH_FN(bernoulli_float));
  m.impl("bernoulli_.Tensor", TORCH_FN(bernoulli_tensor));
  m.impl("bernoulli.out", TORCH_FN(bernoulli_out));
  m.impl("native_dropout", TORCH_FN(native_dropout));
}

}  // namespace npusim
