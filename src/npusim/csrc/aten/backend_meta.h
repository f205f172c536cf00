// Backend metadata of npu tensors (backend_meta.cpp): fields kept on the
// TensorImpl, carried by torch.save / torch.load and by shallow copies.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace npusim {

// The named integer fields of an npu tensor (empty: none); raises for other devices.
std::map<std::string, int64_t> get_backend_meta(const at::Tensor& t);
// Replaces them (an empty map clears them).
void set_backend_meta(const at::Tensor& t, std::map<std::string, int64_t> fields);

}  // namespace npusim
