// See Note [Philox blocks in batches].
#include "philox_blocks.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace npusim {

// Philox-4x32's round multipliers and Weyl key increments (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC 2011; at::Philox4_32's).
constexpr uint32_t kPhiloxMultiplier0 = 0xD2511F53;
constexpr uint32_t kPhiloxMultiplier1 = 0xCD9E8D57;
constexpr uint32_t kPhiloxKeyStep0 = 0x9E3779B9;
constexpr uint32_t kPhiloxKeyStep1 = 0xBB67AE85;
constexpr int kPhiloxRounds = 10;

// One 32-bit lane per block: the portable form, which compilers vectorize
// with the 32->64-bit widening they see fit.
void philox_lanes_portable(uint64_t seed, uint64_t offset, uint64_t first, PhiloxBatch& out) {
  uint32_t c0[kPhiloxBatch];
  uint32_t c1[kPhiloxBatch];
  uint32_t c2[kPhiloxBatch];
  uint32_t c3[kPhiloxBatch];
  for (int j = 0; j < kPhiloxBatch; ++j) {
    // The 128-bit counter is offset + first + j (subsequence 0): a sum that
    // wraps 2^64 carries into the third word, as at::Philox4_32::incr_n.
    const uint64_t counter = offset + first + static_cast<uint64_t>(j);
    c0[j] = static_cast<uint32_t>(counter);
    c1[j] = static_cast<uint32_t>(counter >> 32);
    c2[j] = counter < offset ? 1u : 0u;
    c3[j] = 0;
  }
  uint32_t key0 = static_cast<uint32_t>(seed);
  uint32_t key1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    for (int j = 0; j < kPhiloxBatch; ++j) {
      const uint64_t product0 = static_cast<uint64_t>(c0[j]) * kPhiloxMultiplier0;
      const uint64_t product1 = static_cast<uint64_t>(c2[j]) * kPhiloxMultiplier1;
      const uint32_t next0 = static_cast<uint32_t>(product1 >> 32) ^ c1[j] ^ key0;
      const uint32_t next2 = static_cast<uint32_t>(product0 >> 32) ^ c3[j] ^ key1;
      c1[j] = static_cast<uint32_t>(product1);
      c3[j] = static_cast<uint32_t>(product0);
      c0[j] = next0;
      c2[j] = next2;
    }
    key0 += kPhiloxKeyStep0;
    key1 += kPhiloxKeyStep1;
  }
  for (int j = 0; j < kPhiloxBatch; ++j) {
    out.x[0][j] = c0[j];
    out.x[1][j] = c1[j];
    out.x[2][j] = c2[j];
    out.x[3][j] = c3[j];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The x86 forms keep each word of 8 (AVX2) or 16 (AVX-512) blocks in one
// register as 32-bit lanes. vpmuludq multiplies the even lanes into 64-bit
// products; the odd lanes are shifted down and multiplied the same way, and
// the low and high halves are blended back into 32-bit lanes. They take
// 64-bit counters: a batch whose counters reach 2^64 (offset + first within
// kPhiloxBatch of it, or past it) takes the portable form.

__attribute__((target("avx2"))) void philox_lanes_avx2(uint64_t seed, uint64_t first, int count, PhiloxBatch& out) {
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxMultiplier0);
  const __m256i m1 = _mm256_set1_epi64x(kPhiloxMultiplier1);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int g = 0; g < count; g += 8) {
    const uint64_t base = first + static_cast<uint64_t>(g);
    // low words: base's low word + lane (a wrap carries into the high word)
    const __m256i low = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(base))), lane);
    const __m256i wrapped = _mm256_cmpgt_epi32(
        _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(base))), _mm256_set1_epi32(INT32_MIN)),
        _mm256_xor_si256(low, _mm256_set1_epi32(INT32_MIN)));
    __m256i c0 = low;
    __m256i c1 = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 32))), wrapped);
    __m256i c2 = _mm256_setzero_si256();
    __m256i c3 = _mm256_setzero_si256();
    uint32_t key0 = static_cast<uint32_t>(seed);
    uint32_t key1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < kPhiloxRounds; ++round) {
      const __m256i even0 = _mm256_mul_epu32(c0, m0);
      const __m256i odd0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i even1 = _mm256_mul_epu32(c2, m1);
      const __m256i odd1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i lo0 = _mm256_blend_epi32(even0, _mm256_slli_epi64(odd0, 32), 0xAA);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(even0, 32), odd0, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(even1, _mm256_slli_epi64(odd1, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(even1, 32), odd1, 0xAA);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(key0)));
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(key1)));
      c1 = lo1;
      c3 = lo0;
      key0 += kPhiloxKeyStep0;
      key1 += kPhiloxKeyStep1;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&out.x[0][g]), c0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&out.x[1][g]), c1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&out.x[2][g]), c2);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&out.x[3][g]), c3);
  }
}

__attribute__((target("avx512f"))) void philox_lanes_avx512(uint64_t seed, uint64_t first, int count, PhiloxBatch& out) {
  const __m512i m0 = _mm512_set1_epi64(kPhiloxMultiplier0);
  const __m512i m1 = _mm512_set1_epi64(kPhiloxMultiplier1);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  constexpr __mmask16 kOdd = 0xAAAA;
  for (int g = 0; g < count; g += 16) {
    const uint64_t base = first + static_cast<uint64_t>(g);
    const __m512i base_low = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base)));
    const __m512i low = _mm512_add_epi32(base_low, lane);
    // lanes whose low word wrapped carry one into the high word
    const __mmask16 wrapped = _mm512_cmplt_epu32_mask(low, base_low);
    const __m512i high = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 32)));
    __m512i c0 = low;
    __m512i c1 = _mm512_mask_add_epi32(high, wrapped, high, _mm512_set1_epi32(1));
    __m512i c2 = _mm512_setzero_si512();
    __m512i c3 = _mm512_setzero_si512();
    uint32_t key0 = static_cast<uint32_t>(seed);
    uint32_t key1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < kPhiloxRounds; ++round) {
      const __m512i even0 = _mm512_mul_epu32(c0, m0);
      const __m512i odd0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
      const __m512i even1 = _mm512_mul_epu32(c2, m1);
      const __m512i odd1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
      const __m512i lo0 = _mm512_mask_blend_epi32(kOdd, even0, _mm512_slli_epi64(odd0, 32));
      const __m512i hi0 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(even0, 32), odd0);
      const __m512i lo1 = _mm512_mask_blend_epi32(kOdd, even1, _mm512_slli_epi64(odd1, 32));
      const __m512i hi1 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(even1, 32), odd1);
      // 0x96: a ^ b ^ c
      c0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32(static_cast<int>(key0)), 0x96);
      c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32(static_cast<int>(key1)), 0x96);
      c1 = lo1;
      c3 = lo0;
      key0 += kPhiloxKeyStep0;
      key1 += kPhiloxKeyStep1;
    }
    _mm512_storeu_si512(&out.x[0][g], c0);
    _mm512_storeu_si512(&out.x[1][g], c1);
    _mm512_storeu_si512(&out.x[2][g], c2);
    _mm512_storeu_si512(&out.x[3][g], c3);
  }
}

#endif

// The forms of the kernel; a machine without a form's instructions never takes it.
enum class PhiloxForm { kPortable, kAvx2, kAvx512 };

// The best form this machine has, found once.
PhiloxForm best_philox_form() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const PhiloxForm form = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
      return PhiloxForm::kAvx512;
    }
    return __builtin_cpu_supports("avx2") ? PhiloxForm::kAvx2 : PhiloxForm::kPortable;
  }();
  return form;
#else
  return PhiloxForm::kPortable;
#endif
}

// philox_blocks in `form`, which this machine must have.
void philox_blocks_in(PhiloxForm form, uint64_t seed, uint64_t offset, uint64_t first, int count, PhiloxBatch& out) {
#if defined(__x86_64__) && defined(__GNUC__)
  // At or past 2^64 the counter carries into its third word: the portable form.
  const uint64_t start = offset + first;
  const bool carries = start < offset || start + static_cast<uint64_t>(kPhiloxBatch - 1) < start;
  if (!carries) {
    switch (form) {
      case PhiloxForm::kAvx512:
        philox_lanes_avx512(seed, start, count, out);
        return;
      case PhiloxForm::kAvx2:
        philox_lanes_avx2(seed, start, count, out);
        return;
      case PhiloxForm::kPortable:
        break;
    }
  }
#endif
  philox_lanes_portable(seed, offset, first, out);
}

void philox_blocks(uint64_t seed, uint64_t offset, uint64_t first, int count, PhiloxBatch& out) {
  philox_blocks_in(best_philox_form(), seed, offset, first, count, out);
}

bool philox_words_by_form(const char* form, uint64_t seed, uint64_t offset, int64_t n, uint32_t* words) {
  PhiloxForm chosen = best_philox_form();
  if (std::strcmp(form, "portable") == 0) {
    chosen = PhiloxForm::kPortable;
  } else if (std::strcmp(form, "avx2") == 0 || std::strcmp(form, "avx512") == 0) {
#if defined(__x86_64__) && defined(__GNUC__)
    const bool avx512 = form[3] == '5';
    if (!(avx512 ? __builtin_cpu_supports("avx512f") : __builtin_cpu_supports("avx2"))) {
      return false;
    }
    chosen = avx512 ? PhiloxForm::kAvx512 : PhiloxForm::kAvx2;
#else
    return false;
#endif
  } else if (std::strcmp(form, "auto") != 0) {
    return false;
  }
  PhiloxBatch batch;
  for (int64_t first = 0; first < n; first += kPhiloxBatch) {
    const int count = static_cast<int>(std::min<int64_t>(kPhiloxBatch, n - first));
    philox_blocks_in(chosen, seed, offset, static_cast<uint64_t>(first), count, batch);
    for (int j = 0; j < count; ++j) {
      for (int w = 0; w < 4; ++w) {
        words[4 * (first + j) + w] = batch.x[w][j];
      }
    }
  }
  return true;
}

}  // namespace npusim
