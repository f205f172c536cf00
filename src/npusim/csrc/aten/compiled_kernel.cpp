// Calls a compiled region's C++ kernel by its C entry point.
#include "compiled_kernel.h"

#include <c10/util/Exception.h>

#include <array>
#include <utility>

namespace npusim {

// Note [Compiled kernels without the GIL]
// Inductor builds each C++ kernel of a compiled region as a Python extension
// whose one function parses its arguments (tensors' data pointers, sizes) and
// calls the kernel's C entry point, `extern "C" void kernel(const float*
// in_ptr0, float* out_ptr0, const int64_t ks0, ...)`. Called through Python,
// a kernel needs the GIL: run on the host (Note [Compiled code in stream
// order]) it first waits for the stream, so a compiled region ran in lock
// step with the device, and replayed in an npu graph (Note [Compiled code in
// an npu graph]) the stream worker took the GIL for every kernel, waiting for
// the host's Python (which holds it for a whole step of Dynamo's and
// AOTAutograd's wrappers) and making the host signal the GIL's hand-over:
// a reduce-overhead step cost the host 3 times eager's CPU. So the generated
// call names its arguments' C types (the signature inductor writes, from
// cpp_argdefs: `T*` written, `const T*` read, `const int64_t`), the launch
// resolves the kernel's entry point once (its library's `kernel` symbol), and
// the kernel becomes a stream task that calls the entry point with the
// arguments as the host saw them: data pointers and integers. No tensor is
// held: the stream-ordered free keeps the memory, as for any npu task (Note
// [Stream-ordered free]). The call passes every argument as a 64-bit word,
// which is the entry point's own calling convention only where pointers and
// 64-bit integers are passed alike, in the same registers and then the same
// stack slots in order: the System V x86-64 and AAPCS64 ABIs, where an
// argument of either type is of the integer class, and no other (what
// libffi would do for these types, without a dependency on its headers). A
// kernel with a float argument (an unbacked float size), with more than
// kMaxCompiledKernelArgs arguments, given a tensor that is not on the npu, or
// built on another platform, keeps the Python call.

namespace {

using Word = uint64_t;
using Caller = void (*)(void*, const Word*);

template <size_t I>
using WordAt = Word;

template <size_t... I>
void call_with(void* entry, const Word* words, std::index_sequence<I...>) {
  using Entry = void (*)(WordAt<I>...);
  reinterpret_cast<Entry>(entry)(words[I]...);
}

template <size_t N>
void call_n(void* entry, const Word* words) {
  call_with(entry, words, std::make_index_sequence<N>());
}

template <size_t... N>
constexpr std::array<Caller, sizeof...(N)> make_callers(std::index_sequence<N...>) {
  return {&call_n<N>...};
}

constexpr auto kCallers = make_callers(std::make_index_sequence<kMaxCompiledKernelArgs + 1>());

}  // namespace

bool compiled_kernels_callable() {
#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
  static_assert(sizeof(void*) == sizeof(Word) && sizeof(int64_t) == sizeof(Word));
  return true;
#else
  return false;
#endif
}

void CompiledKernelCall::operator()() const {
  TORCH_INTERNAL_ASSERT(words.size() <= kMaxCompiledKernelArgs, "npusim: a compiled kernel's ", words.size(),
      " arguments exceed ", kMaxCompiledKernelArgs);
  kCallers[words.size()](entry, words.data());
}

}  // namespace npusim
