// A compiled region's C++ kernel as a stream task that calls its C entry
// point directly, without Python (compiled_kernel.cpp). See Note [Compiled
// kernels without the GIL].
#pragma once

#include "../runtime/stream.h"

#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>

namespace npusim {

// The most arguments a kernel may take to be called this way.
constexpr size_t kMaxCompiledKernelArgs = 64;

// Whether this platform passes pointers and 64-bit integers alike (its ABI's
// integer class), so that an entry point taking only those can be called with
// its arguments as 64-bit words.
bool compiled_kernels_callable();

// One call of a kernel's C entry point `void kernel(...)` whose arguments are
// all pointers or 64-bit integers, given as words in order.
struct CompiledKernelCall {
  void* entry = nullptr;
  c10::SmallVector<uint64_t, 12> words;

  void operator()() const;
};

}  // namespace npusim
