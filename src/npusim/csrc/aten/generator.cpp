// The npu generator (see Note [npu Philox stream] in generator.h) and the
// per-device default generators.
#include "generator.h"

#include "op_arguments.h"

#include "../runtime/stream.h"

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

}  // namespace

NpuGeneratorImpl::NpuGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kNpu, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void NpuGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

void NpuGeneratorImpl::set_offset(uint64_t offset) {
  check_offset(offset, "set_offset");
  offset_ = offset;
}

uint64_t NpuGeneratorImpl::get_offset() const {
  return offset_;
}

uint64_t NpuGeneratorImpl::current_seed() const {
  return seed_;
}

uint64_t NpuGeneratorImpl::seed() {
  const uint64_t random = c10::detail::getNonDeterministicRandom(/*is_cuda=*/true);
  set_current_seed(random);
  return random;
}

c10::intrusive_ptr<c10::TensorImpl> NpuGeneratorImpl::get_state() const {
  at::Tensor state = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, at::ScalarType::Byte,
      std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  auto* bytes = static_cast<uint8_t*>(state.data_ptr());
  std::memcpy(bytes, &seed_, kSeedBytes);
  std::memcpy(bytes + kSeedBytes, &offset_, sizeof(offset_));
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
  seed_ = seed;
  offset_ = offset;
}

PhiloxInputs NpuGeneratorImpl::philox_inputs(uint64_t numel) {
  const PhiloxInputs inputs{seed_, offset_};
  offset_ += (numel + 3) / 4 * 4;
  return inputs;
}

NpuGeneratorImpl* NpuGeneratorImpl::clone_impl() const {
  auto* gen = new NpuGeneratorImpl(device().index(), seed_);
  gen->offset_ = offset_;
  return gen;
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

PhiloxInputs philox_inputs(const std::optional<at::Generator>& gen, c10::DeviceIndex device, uint64_t numel) {
  auto* impl = at::get_generator_or_default<NpuGeneratorImpl>(gen, default_generator(device));
  std::lock_guard<std::mutex> lock(impl->mutex_);
  return impl->philox_inputs(numel);
}

at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  const PhiloxInputs inputs = philox_inputs(gen, device, kNonElementwiseOffset);
  // Subsequence 1: never a block that an elementwise op (subsequence 0) uses.
  at::Philox4_32 engine(inputs.seed, /*subsequence=*/1, inputs.offset);
  const uint64_t lo = engine();
  const uint64_t hi = engine();
  return at::detail::createCPUGenerator(lo | (hi << 32));
}

at::Generator cpu_generator_argument(const c10::IValue& arg, const DeviceRules& rules) {
  std::optional<at::Generator> gen;
  if (!arg.isNone()) {
    gen = arg.toGenerator();
  }
  if (!rules.on_npu()) {
    // Only an npu generator's dispatch key brings an op without npu tensors here.
    TORCH_CHECK(false, "Expected a 'cpu' device type for generator but found '",
        gen.has_value() ? gen->device().type() : kNpu, "' (when running ", rules.op().schema().operator_name(), ")");
  }
  return cpu_generator_for(gen, rules.device());
}

}  // namespace npusim
