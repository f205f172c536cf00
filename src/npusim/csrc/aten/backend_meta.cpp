// Backend metadata of npu tensors: a small map of named integer fields on the
// TensorImpl, and PyTorch's PrivateUse1 serialization hooks for it.
//
// Note [npu backend metadata]
// PyTorch gives a backend one slot of its own per tensor (c10::BackendMeta,
// in the TensorImpl's extra metadata) and two hooks that torch.save and
// torch.load call through torch._utils.get_tensor_metadata /
// set_tensor_metadata (TensorBackendMetaRegistry); torch_npu serializes its
// storage descriptor through them. npusim keeps a map of named integer fields,
// so that whatever the Python layers want to carry (npusim.runtime.backend_meta)
// needs no C++: the map is saved as keys
// "npusim/<name>/<value>" (the hooks' map holds booleans, so the value rides
// in the key, as torch_npu does), keys of other shapes are ignored on load.
// clone() copies the map, so a detached or shallow-copied tensor (detach(),
// .data, set_data) has its own copy rather than a shared one; views and
// copies (a new TensorImpl from an op) start without metadata, as on torch_npu's
// TensorImpl-level fields.
#include "backend_meta.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <map>
#include <string>
#include <unordered_map>

namespace npusim {
namespace {

constexpr const char* kKeyPrefix = "npusim/";

struct NpuBackendMeta final : c10::BackendMeta {
  std::map<std::string, int64_t> fields;

  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>& /*self*/) const override {
    auto copy = c10::make_intrusive<NpuBackendMeta>();
    copy->fields = fields;
    return copy;
  }
};

const NpuBackendMeta* meta_of(const at::Tensor& t) {
  return dynamic_cast<const NpuBackendMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

void set_fields(const at::Tensor& t, std::map<std::string, int64_t> fields) {
  if (fields.empty()) {
    t.unsafeGetTensorImpl()->set_backend_meta(nullptr);
    return;
  }
  auto meta = c10::make_intrusive<NpuBackendMeta>();
  meta->fields = std::move(fields);
  t.unsafeGetTensorImpl()->set_backend_meta(meta);
}

void check_npu(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, op,
      ": backend metadata is kept on npu tensors only, got a tensor on ", t.device());
}

// torch.save: each field as one key of the metadata map.
void serialize(const at::Tensor& t, std::unordered_map<std::string, bool>& map) {
  if (const NpuBackendMeta* meta = meta_of(t)) {
    for (const auto& [name, value] : meta->fields) {
      map[kKeyPrefix + name + "/" + std::to_string(value)] = true;
    }
  }
}

// torch.load: the fields back from keys "npusim/<name>/<value>".
void deserialize(const at::Tensor& t, std::unordered_map<std::string, bool>& map) {
  std::map<std::string, int64_t> fields;
  const std::string prefix(kKeyPrefix);
  for (const auto& [key, on] : map) {
    const size_t slash = key.rfind('/');
    if (!on || key.compare(0, prefix.size(), prefix) != 0 || slash < prefix.size() + 1) {
      continue;
    }
    try {
      size_t used = 0;
      const int64_t value = std::stoll(key.substr(slash + 1), &used);
      if (used == key.size() - slash - 1) {
        fields[key.substr(prefix.size(), slash - prefix.size())] = value;
      }
    } catch (const std::exception&) {
      // not a field of ours: ignored, as foreign keys are
    }
  }
  if (!fields.empty()) {
    set_fields(t, std::move(fields));
  }
}

[[maybe_unused]] const bool g_serialization_registered = [] {
  torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &serialize, &deserialize);
  return true;
}();

}  // namespace

std::map<std::string, int64_t> get_backend_meta(const at::Tensor& t) {
  check_npu(t, "get_backend_meta");
  const NpuBackendMeta* meta = meta_of(t);
  return meta == nullptr ? std::map<std::string, int64_t>() : meta->fields;
}

void set_backend_meta(const at::Tensor& t, std::map<std::string, int64_t> fields) {
  check_npu(t, "set_backend_meta");
  set_fields(t, std::move(fields));
}

}  // namespace npusim
