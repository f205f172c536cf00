// aten::record_stream for npu tensors: CUDA's Tensor.record_stream, handed
// to the caching allocator (Note [Stream-ordered free]).
#include "../runtime/device_allocator.h"

#include <ATen/ATen.h>
#include <torch/library.h>

namespace npusim {
namespace {

void record_stream_kernel(at::Tensor& self, c10::Stream stream) {
  record_stream(self.storage().data_ptr(), stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("record_stream", TORCH_FN(record_stream_kernel));
}

}  // namespace npusim
