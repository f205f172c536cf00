// Philox-4x32-10 blocks many at a time: the random bits of the npu's
// elementwise random ops. See Note [Philox blocks in batches].
#pragma once

#include <cstdint>

namespace npusim {

// Note [Philox blocks in batches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Element i of a random op takes the 128-bit Philox block at counter o + i
// (Note [npu Philox stream]). PyTorch's at::Philox4_32 makes one block per
// ten rounds of scalar work and hands it out one 32-bit word per call, so
// drawing an element cost a branch per word and a block's rounds ran one
// multiply after another. philox_blocks computes kPhiloxBatch consecutive
// blocks at once, each word of the batch in its own array, so that every
// round is the same few operations over kPhiloxBatch lanes: the compiler
// turns them into SIMD (vpmuludq for the 32x32->64-bit products), CUDA's
// curand_uniform4 way of drawing four words per counter, across counters.
// The words are exactly at::Philox4_32's (a test compares them with a
// reference, across a 2^64 counter carry), so the numbers do not change. On x86-64 the function
// is built for AVX-512, AVX2 and the baseline, and the loader picks one for
// the machine (GCC's target_clones); elsewhere it is built once, portable.
// A chunk of a parallel split starts wherever its first element is: its
// blocks depend on the element's index only, never on the thread count.
// (The one-block kernels seeded each chunk's engine at offset + start in 64
// bits, so a chunk starting past 2^64 lost the carry; offsets never get near
// there in practice, but the counter is now the 128-bit sum everywhere.)
constexpr int kPhiloxBatch = 32;

// The words of kPhiloxBatch consecutive Philox blocks: x[w][j] is word w of
// the block at counter offset + first + j.
struct PhiloxBatch {
  uint32_t x[4][kPhiloxBatch];
};

// Fills lanes 0 .. count - 1 of `out` (count <= kPhiloxBatch; a form may
// fill more) with the blocks of key `seed` at the 128-bit counters offset +
// first + j (an op's offset, and the index of the batch's first element;
// subsequence 0, so a sum past 2^64 carries into the third word, as
// at::Philox4_32(seed, 0, offset) stepped on).
void philox_blocks(uint64_t seed, uint64_t offset, uint64_t first, int count, PhiloxBatch& out);

}  // namespace npusim
