// Standard normal floats from Philox blocks, many at a time and bit for bit
// what glibc's scalar log1pf and cosf give. See Note [Box-Muller bit for bit].
#pragma once

#include "philox_blocks.h"

#include <cstdint>

namespace npusim {

// Note [Box-Muller bit for bit]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A float normal_ is Box-Muller over each element's Philox block: with u1
// from word 0 and u2 from word 2 (24 bits each, k * 2^-24),
//   z = sqrtf(-2 * log1pf(-u1)) * cosf((2 * pi_f) * u2),
// all in float, as CUDA's curand_normal4 computes in float. Its numbers were
// those of glibc's scalar log1pf and cosf, about 9 and 6 ns a call on this
// project's VM: most of normal_'s time. Compilers do not vectorize the calls
// (not without -ffast-math), and glibc's vector variants (libmvec) are other
// algorithms. So this file runs the scalar algorithms themselves,
// operation for operation, over vectors of lanes:
// - log1pf is glibc's sysdeps/ieee754/flt-32/s_log1pf.c (fdlibm's float
//   code; glibc builds it for plain x86-64, so no fused multiply-adds): 8
//   float lanes, every branch an input in (-1, 0] can take computed and the
//   lane's one picked by masks.
// - cosf is glibc's s_cosf.c (ARM's optimized routines: a double-precision
//   reduction by pi/2 and polynomial), in the form glibc's x86-64 ifunc picks
//   on a CPU with FMA (s_cosf-fma.c, built with -mfma): the fused
//   multiply-adds are where that build's disassembly has them. 4 double
//   lanes; the inputs here, fl(2 pi_f u2) in [0, 2 pi], take the small-angle
//   and the one-step reduction paths only.
// An input of either function is one of 2^24 values (k = 0 .. 2^24 - 1), so
// exactness is checked, not argued: acl.box_muller_mismatches runs every one
// through each form and compares it with the portable scalar form and with
// the machine's libm (tests/test_random_kernels.py). sqrtf and the products
// and sums around the two calls are IEEE operations in any form. The numbers
// are those normal_ drew before (its stored digests are unchanged), and they
// no longer depend on the machine's libm. (glibc's cosf built without FMA,
// separate products and sums, gives the same bits on all 2^24 inputs here, in
// a C loop on this VM; other libms were not compared.) The forms: AVX-512
// (16 float and 8 double lanes) where the CPU has it, else AVX2 with FMA (8
// and 4) where it has both, else the portable scalar one (std::fma, exact in
// software where the CPU has none: slower than libm there). One form per
// instruction set, as philox_blocks' (a target attribute cannot vary with a
// template's arguments).
// The AVX2 form's functions take 1.6 (log1pf) and 1.5 (cosf) ns per element
// in C loops over cached arrays on this VM, against libm's 5.0 and 2.4.

// out[j] = sqrtf(-2 log1pf(-u1)) * cosf((2 pi_f) u2) for the block in lane
// j of `batch`, u1 = (x[0][j] >> 8) * 2^-24 and u2 = (x[2][j] >> 8) * 2^-24,
// for j < count; the AVX2 form computes (and writes) up to the next multiple
// of 8, lanes philox_blocks fills. `out` holds kPhiloxBatch floats.
void standard_normal_floats(const PhiloxBatch& batch, int count, float* out);

// Counts, over every input the two functions take here (x = -k 2^-24 and y =
// fl(2 pi_f k 2^-24), k < 2^24), the results of `form` ("auto", "portable",
// "avx2", "avx512") that differ in any bit from `reference`'s ("portable", or "libm":
// this machine's log1pf and cosf). False (counts untouched) for a form or a
// reference this machine lacks.
bool box_muller_mismatches(const char* form, const char* reference, int64_t& log1p_mismatches,
    int64_t& cos_mismatches);

}  // namespace npusim
