// The npu's arithmetic keeps subnormal floats whatever the CPU thread that
// runs a kernel has been told (header-only: both extensions may use it).
//
// Note [Subnormals on npu]
// torch.set_flush_denormal(True) is a CPU setting: it sets the calling
// thread's flush-to-zero and denormals-are-zero bits (x86 MXCSR FTZ|DAZ,
// aarch64 FPCR.FZ). CUDA's kernels keep subnormals whatever it says, and so
// does Atlas A2 hardware (the 910B of npusim's default profile) by default;
// npu follows them. npu kernels run on CPU threads, though, and those bits
// are per thread: a stream worker inherits its creator's (the user's thread
// that first used the stream), and a kernel the host runs in the stream's
// place (Note [Work on an idle stream], launch blocking) runs under the
// user's. So the same program gave 0 or a subnormal depending on whether the
// stream was idle, and on whether the user flushed before or after the
// stream's first task. Now a stream worker clears the bits when it starts,
// and each host run of a device kernel clears them for its duration
// (KeepSubnormals): npu results no longer depend on which thread ran them.
// The conversion of a device value to a Python number (.item(),
// _local_scalar_dense) stays the host's, under the user's setting, as on
// CUDA, where it happens on the host after the copy. A host run's OpenMP
// team threads keep the bits they started with (PyTorch's own setting never
// reaches them either). Most host runs are small (an op on an idle stream:
// up to 16,384 elements), below the grain at which CPU kernels split their
// work; an op that must run on the host (a data-dependent shape) and every
// op under launch blocking may be larger.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace npusim {

// The calling thread's flush-to-zero / denormals-are-zero bits (0: none set).
inline uint64_t flush_denormal_bits() {
#if defined(__x86_64__) || defined(__i386__)
  return _mm_getcsr() & 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
#elif defined(__aarch64__)
  uint64_t fpcr = 0;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  return fpcr & (uint64_t{1} << 24);  // FZ
#else
  return 0;
#endif
}

// Sets the calling thread's flush-to-zero / denormals-are-zero bits to `bits`
// (a value flush_denormal_bits returned).
inline void set_flush_denormal_bits(uint64_t bits) {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr((_mm_getcsr() & ~0x8040u) | static_cast<unsigned>(bits));
#elif defined(__aarch64__)
  uint64_t fpcr = 0;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  fpcr = (fpcr & ~(uint64_t{1} << 24)) | bits;
  asm volatile("msr fpcr, %0" : : "r"(fpcr));
#else
  (void)bits;
#endif
}

// Clears the bits for its scope when they are set (one register read
// otherwise): a device kernel run by the host (Note [Subnormals on npu]).
class KeepSubnormals {
 public:
  explicit KeepSubnormals(bool keep = true) : saved_(keep ? flush_denormal_bits() : 0) {
    if (saved_ != 0) {
      set_flush_denormal_bits(0);
    }
  }
  ~KeepSubnormals() {
    if (saved_ != 0) {
      set_flush_denormal_bits(saved_);
    }
  }
  KeepSubnormals(const KeepSubnormals&) = delete;
  KeepSubnormals& operator=(const KeepSubnormals&) = delete;

 private:
  uint64_t saved_;
};

}  // namespace npusim
