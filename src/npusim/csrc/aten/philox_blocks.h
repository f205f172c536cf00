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
// blocks at once, every round being the same few operations over all of
// them, as CUDA's curand_uniform4 draws four words per counter, here across
// counters. On x86-64 the words of 16 (AVX-512) or 8 (AVX2) blocks sit in
// one register each, 32-bit lanes multiplied by vpmuludq on the even and
// the odd lanes; the form is picked once from the CPU's features
// (__builtin_cpu_supports), and a machine with neither, another
// architecture, or a batch whose counters reach 2^64 takes the portable
// form, one array per word, which compilers vectorize as they can. In C
// loops on this project's VM (2 cores, under load) the forms took 1.9 / 3.4
// / 7.3 ns per block (AVX-512 / AVX2 / portable), at::Philox4_32 about 10.
// acl.philox_words draws with a named form, so that tests check each one
// the machine has. The words are
// exactly at::Philox4_32's (a test compares them with a reference, across
// a 2^64 counter carry), so the numbers do not change.
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

// The forms of philox_blocks, by name: "auto" (what philox_blocks picks),
// "portable", "avx2", "avx512". Fills words[4 * n] (block j's words at
// 4j .. 4j + 3) with the blocks at counters offset .. offset + n - 1 drawn
// by that form, so that a test can check each form the machine has against
// a reference; false (nothing written) for a form the machine lacks.
bool philox_words_by_form(const char* form, uint64_t seed, uint64_t offset, int64_t n, uint32_t* words);

}  // namespace npusim
