// The npu random number generator: CUDA's contract, a counter-based Philox
// state of (seed, offset). See Note [npu Philox stream].
#pragma once

#include "../runtime/npu_type.h"
#include "../runtime/stream.h"

#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/GeneratorImpl.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
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

// Note [Graph-safe Philox state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// As CUDA's CUDAGeneratorImpl. While the current stream of the generator's
// device is captured (an npu graph), a random op does not take (seed, offset)
// by value: it gets the addresses of two words (its capture slot's) holding the seed and the
// base offset of the capture's replays, plus its own offset within the graph
// (the intragraph offset, which each op advances as it advances the offset
// eagerly); its recorded task reads them when it runs (PhiloxState::unpack).
// Each (generator state, capture) pair has one slot, made on first use, which
// registers the state with the capture (a CaptureClient): capture_end takes
// the whole graph's increment; each replay writes the generator's current seed
// and offset into the slot, on the replay stream before the graph's tasks, and
// advances the offset by the increment in host order. So every replay draws
// fresh numbers, and a replay after manual_seed(s) draws what the same ops run
// eagerly after manual_seed(s) draw. During capture, as CUDA: manual_seed is
// refused unless the seed is unchanged, seed(), get_offset, set_offset and
// clone are refused, get_state / set_state read and write the intragraph
// offset (so preserve_rng_state and activation checkpointing work inside a
// capture); graphsafe_get_state / graphsafe_set_state share or swap the state
// object. The fallback's non-elementwise random ops take a PhiloxState too:
// their CPU generator is seeded when the recorded task runs.

// The Philox inputs of one random op: its key and its first block.
struct PhiloxInputs {
  uint64_t seed;
  uint64_t offset;
};

// CUDA's PhiloxCudaState: the inputs by value, or, in a capture, where they
// will be when the op runs.
struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // captured: the intragraph offset
  const int64_t* seed_ptr = nullptr;  // captured: the slot's words
  const int64_t* offset_ptr = nullptr;
  std::shared_ptr<const void> slot;  // keeps the slot's memory alive for the graph

  bool captured() const {
    return seed_ptr != nullptr;
  }
  PhiloxInputs unpack() const {
    if (seed_ptr == nullptr) {
      return {seed, offset};
    }
    return {static_cast<uint64_t>(*seed_ptr), static_cast<uint64_t>(*offset_ptr) + offset};
  }
};

// The (seed, offset) of a generator, shared by generators that
// graphsafe_set_state points at it, and its slots in captures underway or
// kept by graphs. See Note [Graph-safe Philox state].
class NpuGeneratorState final : public CaptureClient, public std::enable_shared_from_this<NpuGeneratorState> {
 public:
  explicit NpuGeneratorState(c10::DeviceIndex device, uint64_t seed) : device_(device), seed_(seed) {}

  uint64_t seed() const;
  // Outside capture: sets the seed and resets the offset. In `capture`:
  // refused unless the seed is unchanged.
  void set_seed(uint64_t seed, StreamCapture* capture);
  uint64_t offset(StreamCapture* capture) const;  // in a capture: the intragraph offset
  void set_offset(uint64_t offset, StreamCapture* capture);
  // The inputs of an op on `numel` elements; advances the offset (or, in
  // `capture`, the intragraph offset) by numel rounded up to a multiple of 4.
  PhiloxState take(uint64_t numel, StreamCapture* capture);
  std::shared_ptr<NpuGeneratorState> clone() const;

  uint64_t capture_epilogue(uint64_t capture_id) override;
  std::function<void()> replay_prologue(uint64_t capture_id, uint64_t increment) override;
  void capture_destroyed(uint64_t capture_id) override;

 private:
  struct Slot {
    // The seed and the offset a replay's prologue writes and its tasks read.
    // Memory of the slot itself, not of the caching allocator: during a
    // capture the allocator serves the graph's private pool, where a block an
    // intermediate freed earlier in the capture could hold the slot, and a
    // replayed kernel writing that intermediate would then overwrite the
    // prologue's offset with the same values at every replay (every replay drew
    // the same dropout mask). npu memory is host memory, so the tasks read it
    // as they read device memory.
    std::array<int64_t, 2> words{};
    uint64_t intragraph = 0;
  };
  // The slot of `capture` (made on first use, registering this state with it).
  Slot& slot_locked(StreamCapture& capture);

  const c10::DeviceIndex device_;
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
  std::map<uint64_t, std::shared_ptr<Slot>> slots_;
};

class NpuGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit NpuGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);
  NpuGeneratorImpl(c10::DeviceIndex device, std::shared_ptr<NpuGeneratorState> state);
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
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& state) override;
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override;

  // The inputs of an op on `numel` elements (see NpuGeneratorState::take).
  // The caller holds mutex_.
  PhiloxState philox_state(uint64_t numel);
  const std::shared_ptr<NpuGeneratorState>& state() const {
    return state_;
  }

 private:
  NpuGeneratorImpl* clone_impl() const override;
  // The capture of the current stream of this generator's device, if any.
  StreamCapture* capture() const;
  // CUDA's assertNotCapturing.
  void refuse_during_capture(const char* call) const;

  std::shared_ptr<NpuGeneratorState> state_;
};

// The default generator of an npu device (-1: the current device).
const at::Generator& default_generator(c10::DeviceIndex device);

// A new generator for an npu device (-1: the current device).
at::Generator new_generator(c10::DeviceIndex device);

// The npu generator behind `gen` (a generator of another device type is
// CUDA's error naming `op`).
NpuGeneratorImpl* npu_generator(const at::Generator& gen, const char* op);

// Takes the Philox state of an op on `numel` elements from `gen` (or the
// default generator of `device`), under the generator's lock.
PhiloxState philox_state(const std::optional<at::Generator>& gen, c10::DeviceIndex device, uint64_t numel);

// The CPU generator a CPU kernel of a non-elementwise random op draws from,
// seeded from the Philox block at `inputs`; see Note [npu Philox stream].
at::Generator cpu_generator_from(const PhiloxInputs& inputs);

// The Philox state a non-elementwise random op on `device` takes from `gen`
// (kNonElementwiseOffset elements' worth); cpu_generator_from its unpack().
PhiloxState cpu_generator_state(const std::optional<at::Generator>& gen, c10::DeviceIndex device);

}  // namespace npusim
