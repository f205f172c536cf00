// The npu random number generator: CUDA's contract, a counter-based Philox
// state of (seed, offset). See Note [npu Philox stream].
#pragma once

#include "../runtime/npu_type.h"

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <cstdint>
#include <optional>

namespace npusim {

// Note [npu Philox stream]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A generator's state is (seed, offset), 16 bytes in get_state()/set_state()
// laid out as CUDA's: bytes 0-7 the seed, bytes 8-15 the offset, both
// little-endian 64-bit. DTensor's OffsetBasedRNGTracker (torch/distributed/
// tensor/_random.py) reads and rewrites exactly these bytes.
//
// The stream of a seed is PyTorch's at::Philox4_32 (Philox-4x32-10) with
// key = seed and subsequence 0: position p of the stream is the 128-bit block
// at counter p. Element i (row-major over the tensor's logical shape) of an
// elementwise random op that starts at offset o takes block o + i, whatever
// the tensor's strides and however the work is split, so a tensor generated
// whole equals the same tensor generated chunk by chunk at offsets o + start.
//
// Unit and rounding: one offset unit is one Philox block, i.e. one element
// (DTensor advances the offset by numel per op). An op on n elements advances
// the offset by n rounded up to a multiple of 4, which is what the tracker
// assumes on CUDA (offsets are multiples of 4 there); hence set_offset and
// set_state accept only multiples of 4, as CUDA's generator does. With that,
// a Shard(0) DTensor whose local size is a multiple of 4 gets on each rank
// the slice of the unsharded result, and every rank ends at the same offset.
//
// Random ops that are not elementwise (randperm, multinomial, poisson, ...)
// run PyTorch's CPU kernel with a fresh CPU generator seeded from block
// (seed, subsequence 1, offset) and advance the offset by 4
// (kNonElementwiseOffset): deterministic under manual_seed, never touching
// the CPU default generator.
constexpr uint64_t kNonElementwiseOffset = 4;

// The Philox inputs of one random op: its key and its first block.
struct PhiloxInputs {
  uint64_t seed;
  uint64_t offset;
};

class NpuGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit NpuGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);
  ~NpuGeneratorImpl() override = default;

  static c10::DeviceType device_type() {
    return kNpu;
  }

  void set_current_seed(uint64_t seed) override;  // also resets the offset to 0, as CUDA
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // The inputs of an op on `numel` elements; advances the offset by numel
  // rounded up to a multiple of 4. The caller holds mutex_.
  PhiloxInputs philox_inputs(uint64_t numel);

 private:
  NpuGeneratorImpl* clone_impl() const override;

  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generator of an npu device (-1: the current device).
const at::Generator& default_generator(c10::DeviceIndex device);

// A new generator for an npu device (-1: the current device).
at::Generator new_generator(c10::DeviceIndex device);

// Takes the Philox inputs of an op on `numel` elements from `gen` (or the
// default generator of `device`), under the generator's lock. A generator of
// another device type is CUDA's error.
PhiloxInputs philox_inputs(const std::optional<at::Generator>& gen, c10::DeviceIndex device, uint64_t numel);

// The CPU generator a CPU kernel of a non-elementwise random op draws from
// for an op on `device`; see Note [npu Philox stream].
at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device);

}  // namespace npusim
