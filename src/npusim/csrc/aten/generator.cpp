// The npu generator (see Note [npu Philox stream] and Note [Graph-safe Philox
// state] in generator.h) and the per-device default generators.
#include "generator.h"

#include "op_arguments.h"

#include "../runtime/device_allocator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/PhiloxRNGEngine.h>

#include <array>
#include <cstring>
#include <mutex>

namespace npusim {
namespace {

constexpr size_t kSeedBytes = sizeof(uint64_t);
constexpr size_t kStateBytes = kSeedBytes + sizeof(uint64_t);

void check_offset(uint64_t offset, const char* op) {
  // CUDA's generator has the same rule: its kernels consume Philox output in
  // groups of 4, and DTensor's tracker only ever sets multiples of 4.
  TORCH_CHECK(offset % 4 == 0, "npu generator: ", op, " expects the Philox offset to be a multiple of 4, but got ",
      offset);
}

c10::DeviceIndex resolve(c10::DeviceIndex device, const char* op) {
  if (device < 0) {
    device = current_device();
  }
  check_device_index(device, op);
  return device;
}

uint64_t round_up_to_4(uint64_t n) {
  return (n + 3) / 4 * 4;
}

}  // namespace

// ---- the state ------------------------------------------------------------------

uint64_t NpuGeneratorState::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}

void NpuGeneratorState::set_seed(uint64_t seed, StreamCapture* capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture == nullptr) {
    seed_ = seed;
    offset_ = 0;
    return;
  }
  // CUDA's rule (and message, torch_npu's class name): the capture's slot already holds the seed.
  TORCH_CHECK(seed == seed_, "NPUGeneratorImpl::set_current_seed can be called during stream capture only if new "
      "seed is the same as the original seed.");
}

uint64_t NpuGeneratorState::offset(StreamCapture* capture) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture == nullptr) {
    return offset_;
  }
  auto it = slots_.find(capture->id());
  return it == slots_.end() ? 0 : it->second->intragraph;
}

void NpuGeneratorState::set_offset(uint64_t offset, StreamCapture* capture) {
  check_offset(offset, "set_offset");
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture == nullptr) {
    offset_ = offset;
  } else {
    slot_locked(*capture).intragraph = offset;
  }
}

PhiloxState NpuGeneratorState::take(uint64_t numel, StreamCapture* capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  PhiloxState state;
  if (capture == nullptr) {
    state.seed = seed_;
    state.offset = offset_;
    offset_ += round_up_to_4(numel);
    return state;
  }
  Slot& slot = slot_locked(*capture);
  state.seed_ptr = &slot.words[0];
  state.offset_ptr = &slot.words[1];
  state.offset = slot.intragraph;
  state.slot = slots_.at(capture->id());
  slot.intragraph += round_up_to_4(numel);
  return state;
}

std::shared_ptr<NpuGeneratorState> NpuGeneratorState::clone() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto copy = std::make_shared<NpuGeneratorState>(device_, seed_);
  copy->offset_ = offset_;
  return copy;
}

NpuGeneratorState::Slot& NpuGeneratorState::slot_locked(StreamCapture& capture) {
  auto& slot = slots_[capture.id()];
  if (!slot) {
    slot = std::make_shared<Slot>();
    slot->words = {static_cast<int64_t>(seed_), 0};
    capture.add_client(shared_from_this());
  }
  return *slot;
}

uint64_t NpuGeneratorState::capture_epilogue(uint64_t capture_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = slots_.find(capture_id);
  if (it == slots_.end()) {
    return 0;
  }
  const uint64_t increment = it->second->intragraph;
  it->second->intragraph = 0;
  return increment;
}

std::function<void()> NpuGeneratorState::replay_prologue(uint64_t capture_id, uint64_t increment) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = slots_.find(capture_id);
  if (increment == 0 || it == slots_.end()) {
    return {};
  }
  const auto seed = static_cast<int64_t>(seed_);
  const auto offset = static_cast<int64_t>(offset_);
  offset_ += increment;
  // Written on the replay stream, before the graph's tasks read it.
  return [slot = it->second, seed, offset] {
    slot->words = {seed, offset};
  };
}

void NpuGeneratorState::capture_destroyed(uint64_t capture_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  slots_.erase(capture_id);
}

// ---- the generator ----------------------------------------------------------------

NpuGeneratorImpl::NpuGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : NpuGeneratorImpl(device, std::make_shared<NpuGeneratorState>(device, seed)) {}

NpuGeneratorImpl::NpuGeneratorImpl(c10::DeviceIndex device, std::shared_ptr<NpuGeneratorState> state)
    : c10::GeneratorImpl(c10::Device(kNpu, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      state_(std::move(state)) {}

StreamCapture* NpuGeneratorImpl::capture() const {
  if (!any_stream_capturing()) {
    return nullptr;
  }
  return current_stream(device().index()).capture();
}

void NpuGeneratorImpl::refuse_during_capture(const char* call) const {
  if (StreamCapture* c = capture()) {
    TORCH_CHECK(false, "Cannot call NPUGeneratorImpl::", call, " during NPU graph capture (", c->origin().name(),
        " is capturing); call it before capture_begin or after capture_end");
  }
}

void NpuGeneratorImpl::set_current_seed(uint64_t seed) {
  state_->set_seed(seed, capture());
}

void NpuGeneratorImpl::set_offset(uint64_t offset) {
  refuse_during_capture("set_offset");
  state_->set_offset(offset, nullptr);
}

uint64_t NpuGeneratorImpl::get_offset() const {
  refuse_during_capture("get_offset");  // as CUDA: conservatively refused in a capture
  return state_->offset(nullptr);
}

uint64_t NpuGeneratorImpl::current_seed() const {
  return state_->seed();
}

uint64_t NpuGeneratorImpl::seed() {
  refuse_during_capture("seed");
  const uint64_t random = c10::detail::getNonDeterministicRandom(/*is_cuda=*/true);
  set_current_seed(random);
  return random;
}

c10::intrusive_ptr<c10::TensorImpl> NpuGeneratorImpl::get_state() const {
  at::Tensor state = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, at::ScalarType::Byte,
      std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  auto* bytes = static_cast<uint8_t*>(state.data_ptr());
  const uint64_t seed = state_->seed();
  const uint64_t offset = state_->offset(capture());
  std::memcpy(bytes, &seed, kSeedBytes);
  std::memcpy(bytes + kSeedBytes, &offset, sizeof(offset));
  return state.getIntrusivePtr();
}

void NpuGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  at::detail::check_rng_state(new_state);
  const size_t nbytes = static_cast<size_t>(new_state.numel());
  TORCH_CHECK(nbytes == kStateBytes,
      "npu generator: set_state expects a 16-byte state (8-byte seed, 8-byte Philox offset, as "
      "torch.npu.get_rng_state() returns), but got ", nbytes, " bytes");
  const auto* bytes = static_cast<const uint8_t*>(new_state.data());
  uint64_t seed = 0;
  uint64_t offset = 0;
  std::memcpy(&seed, bytes, kSeedBytes);
  std::memcpy(&offset, bytes + kSeedBytes, sizeof(offset));
  check_offset(offset, "set_state");
  StreamCapture* const c = capture();
  state_->set_seed(seed, c);
  state_->set_offset(offset, c);
}

void NpuGeneratorImpl::graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& state) {
  auto* npu = dynamic_cast<NpuGeneratorImpl*>(state.get());
  TORCH_CHECK(npu != nullptr, "graphsafe_set_state: expected an npu generator, got a generator of ",
      state->device());
  state_ = npu->state_;
}

c10::intrusive_ptr<c10::GeneratorImpl> NpuGeneratorImpl::graphsafe_get_state() const {
  return c10::make_intrusive<NpuGeneratorImpl>(device().index(), state_);
}

PhiloxState NpuGeneratorImpl::philox_state(uint64_t numel) {
  return state_->take(numel, capture());
}

NpuGeneratorImpl* NpuGeneratorImpl::clone_impl() const {
  refuse_during_capture("clone_impl");
  return new NpuGeneratorImpl(device().index(), state_->clone());
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::array<at::Generator, kMaxDevices> gens;
  static std::once_flag once;
  std::call_once(once, [] {
    for (int i = 0; i < kMaxDevices; ++i) {
      gens[i] = at::make_generator<NpuGeneratorImpl>(static_cast<c10::DeviceIndex>(i));
    }
  });
  return gens[resolve(device, "npu generator")];
}

at::Generator new_generator(c10::DeviceIndex device) {
  return at::make_generator<NpuGeneratorImpl>(resolve(device, "torch.Generator"));
}

NpuGeneratorImpl* npu_generator(const at::Generator& gen, const char* op) {
  TORCH_CHECK(gen.defined() && gen.device().type() == kNpu, op, ": expected an npu generator, but got a generator of ",
      gen.defined() ? c10::str(gen.device()) : std::string("no device"));
  return at::check_generator<NpuGeneratorImpl>(gen);
}

PhiloxState philox_state(const std::optional<at::Generator>& gen, c10::DeviceIndex device, uint64_t numel) {
  auto* impl = at::get_generator_or_default<NpuGeneratorImpl>(gen, default_generator(device));
  std::lock_guard<std::mutex> lock(impl->mutex_);
  return impl->philox_state(numel);
}

at::Generator cpu_generator_from(const PhiloxInputs& inputs) {
  // Subsequence 1: never a block that an elementwise op (subsequence 0) uses.
  at::Philox4_32 engine(inputs.seed, /*subsequence=*/1, inputs.offset);
  const uint64_t lo = engine();
  const uint64_t hi = engine();
  return at::detail::createCPUGenerator(lo | (hi << 32));
}

PhiloxState cpu_generator_state(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  return philox_state(gen, device, kNonElementwiseOffset);
}

PhiloxState cpu_generator_argument_state(const c10::IValue& arg, const DeviceRules& rules) {
  std::optional<at::Generator> gen;
  if (!arg.isNone()) {
    gen = arg.toGenerator();
  }
  if (!rules.on_npu()) {
    // Only an npu generator's dispatch key brings an op without npu tensors here.
    TORCH_CHECK(false, "Expected a 'cpu' device type for generator but found '",
        gen.has_value() ? gen->device().type() : kNpu, "' (when running ", rules.op().schema().operator_name(), ")");
  }
  return cpu_generator_state(gen, rules.device());
}

at::Generator cpu_generator_argument(const c10::IValue& arg, const DeviceRules& rules) {
  return cpu_generator_from(cpu_generator_argument_state(arg, rules).unpack());
}

}  // namespace npusim
