// See Note [Box-Muller bit for bit].
#include "box_muller.h"

#include <c10/util/bit_cast.h>

#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace npusim {
namespace {
namespace glibc_float {

// s_log1pf.c's constants: ln 2 in two parts and the polynomial in s^2.
constexpr float kLn2Hi = 6.9313812256e-01f;
constexpr float kLn2Lo = 9.0580006145e-06f;
constexpr float kLp1 = 6.6666668653e-01f;
constexpr float kLp2 = 4.0000000596e-01f;
constexpr float kLp3 = 2.8571429849e-01f;
constexpr float kLp4 = 2.2222198546e-01f;
constexpr float kLp5 = 1.8183572590e-01f;
constexpr float kLp6 = 1.5313838422e-01f;
constexpr float kLp7 = 1.4798198640e-01f;
// Bit patterns where s_log1pf.c's branches part, for x in (-1, 0]: |x| below
// 2^-54 and 2^-29, |x| up to 0.2929 (no reduction, k = 0), and the mantissa
// of 1 + x below sqrt(2) (else it is normalized to [sqrt(2)/2, 1)).
constexpr int32_t kAbsBelow2p54 = 0x24800000;
constexpr int32_t kAbsBelow2p29 = 0x31000000;
constexpr int32_t kAbsNoReduction = 0x3e95f61f;
constexpr int32_t kMantissaBelowSqrt2 = 0x3504f7;

// s_cosf.c's constants (__sincosf_table[0]): 2/pi scaled by 2^24 for the
// quadrant, pi/2, the cosine polynomial c0..c4 and the sine one s1..s3.
constexpr double kHalfPiInverseScaled = 0x1.45F306DC9C883p+23;
constexpr double kHalfPi = 0x1.921FB54442D18p0;
constexpr double kC0 = 0x1p0;
constexpr double kC1 = -0x1.ffffffd0c621cp-2;
constexpr double kC2 = 0x1.55553e1068f19p-5;
constexpr double kC3 = -0x1.6c087e89a359dp-10;
constexpr double kC4 = 0x1.99343027bf8c3p-16;
constexpr double kS1 = -0x1.555545995a603p-3;
constexpr double kS2 = 0x1.1107605230bc4p-7;
constexpr double kS3 = -0x1.994eb3774cf24p-13;
// abstop12 (the top 12 bits of |y|) bounds: below pi/4 no reduction, below
// 2^-12 the result is 1.
constexpr uint32_t kTopBelowQuarterPi = 0x3f4;
constexpr uint32_t kTopBelow2p12 = 0x398;

// ---- the portable scalar forms -------------------------------------------

// log1pf(x) for x in (-1, 0], in s_log1pf.c's float operations.
float log1pf_scalar(float x) {
  const auto hx = static_cast<int32_t>(c10::bit_cast<uint32_t>(x));
  const int32_t ax = hx & 0x7fffffff;
  if (ax < kAbsBelow2p29) {
    return ax < kAbsBelow2p54 ? x : x - x * x * 0.5f;
  }
  int32_t k = 0;
  int32_t hu = 1;
  float f = x;
  float c = 0.0f;
  if (ax > kAbsNoReduction) {
    float u = 1.0f + x;
    hu = static_cast<int32_t>(c10::bit_cast<uint32_t>(u));
    k = (hu >> 23) - 127;
    c = (k > 0) ? 1.0f - (u - x) : x - (u - 1.0f);
    c /= u;
    hu &= 0x007fffff;
    if (hu < kMantissaBelowSqrt2) {
      u = c10::bit_cast<float>(static_cast<uint32_t>(hu) | 0x3f800000u);
    } else {
      k += 1;
      u = c10::bit_cast<float>(static_cast<uint32_t>(hu) | 0x3f000000u);
      hu = (0x00800000 - hu) >> 2;
    }
    f = u - 1.0f;
  }
  const float hfsq = 0.5f * f * f;
  const auto kf = static_cast<float>(k);
  if (hu == 0) {
    if (f == 0.0f) {
      return k == 0 ? 0.0f : kf * kLn2Hi + (c + kf * kLn2Lo);
    }
    const float r = hfsq * (1.0f - 0.66666666666666666f * f);
    return k == 0 ? f - r : kf * kLn2Hi - ((r - (kf * kLn2Lo + c)) - f);
  }
  const float s = f / (2.0f + f);
  const float z = s * s;
  const float r = z * (kLp1 + z * (kLp2 + z * (kLp3 + z * (kLp4 + z * (kLp5 + z * (kLp6 + z * kLp7))))));
  if (k == 0) {
    return f - (hfsq - s * (hfsq + r));
  }
  return kf * kLn2Hi - ((hfsq - (s * (hfsq + r) + (kf * kLn2Lo + c))) - f);
}

double cos_polynomial(double x2) {
  const double x4 = x2 * x2;
  const double c1 = std::fma(x2, kC1, kC0);
  const double c2 = std::fma(x2, kC4, kC3);
  const double x6 = x2 * x4;
  return std::fma(c2, x6, std::fma(x4, kC2, c1));
}

double sin_polynomial(double x, double x2) {
  const double s1 = std::fma(x2, kS3, kS2);
  const double x3 = x2 * x;
  const double x7 = x3 * x2;
  return std::fma(s1, x7, std::fma(x3, kS1, x));
}

// cosf(y) for |y| < 120 (the one-step reduction's range), in s_cosf-fma's
// operations.
float cosf_scalar(float y) {
  const uint32_t top = (c10::bit_cast<uint32_t>(y) >> 20) & 0x7ff;
  const double x = y;
  if (top < kTopBelowQuarterPi) {
    return top < kTopBelow2p12 ? 1.0f : static_cast<float>(cos_polynomial(x * x));
  }
  const auto n = (static_cast<int32_t>(x * kHalfPiInverseScaled) + 0x800000) >> 24;
  const double reduced = std::fma(-static_cast<double>(n), kHalfPi, x);
  const double x2 = reduced * reduced;
  if (n & 1) {
    // sin of the reduced angle, negative in quadrant 1, positive in 3
    return static_cast<float>(sin_polynomial((n & 2) ? reduced : -reduced, x2));
  }
  const double c = cos_polynomial(x2);
  return static_cast<float>((n & 2) ? -c : c);
}

float unit_float(uint32_t word) {
  return static_cast<float>(word >> 8) * 0x1.0p-24f;
}

constexpr float kTwoPi = 2.0f * 3.14159265358979323846f;

void standard_normals_portable(const PhiloxBatch& batch, int count, float* out) {
  for (int j = 0; j < count; ++j) {
    const float radius = std::sqrt(-2.0f * log1pf_scalar(-unit_float(batch.x[0][j])));
    out[j] = radius * cosf_scalar(kTwoPi * unit_float(batch.x[2][j]));
  }
}

// ---- the AVX2 form --------------------------------------------------------

#if defined(__x86_64__) && defined(__GNUC__)
#define NPUSIM_AVX2_FMA __attribute__((target("avx2,fma")))
// The per-vector helpers: inlined into the loops (a call would pass the
// vectors through memory).
#define NPUSIM_AVX2_FMA_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

NPUSIM_AVX2_FMA_INLINE __m256 as_ps(__m256i v) {
  return _mm256_castsi256_ps(v);
}

// log1pf_scalar over 8 lanes: each branch's value, the lane's picked by masks.
NPUSIM_AVX2_FMA_INLINE __m256 log1pf_avx2(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256i ax = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff));
  // reduced lanes: 1 + x = 2^k (1 + f), c the rounding error of 1 + x over it
  const __m256 u = _mm256_add_ps(one, x);
  __m256i hu = _mm256_castps_si256(u);
  __m256i k = _mm256_sub_epi32(_mm256_srai_epi32(hu, 23), _mm256_set1_epi32(127));
  const __m256 c_above = _mm256_sub_ps(one, _mm256_sub_ps(u, x));
  const __m256 c_below = _mm256_sub_ps(x, _mm256_sub_ps(u, one));
  __m256 c = _mm256_div_ps(
      _mm256_blendv_ps(c_below, c_above, as_ps(_mm256_cmpgt_epi32(k, _mm256_setzero_si256()))), u);
  hu = _mm256_and_si256(hu, _mm256_set1_epi32(0x007fffff));
  const __m256i below_sqrt2 = _mm256_cmpgt_epi32(_mm256_set1_epi32(kMantissaBelowSqrt2), hu);
  const __m256 normalized = as_ps(_mm256_or_si256(
      hu, _mm256_blendv_epi8(_mm256_set1_epi32(0x3f000000), _mm256_set1_epi32(0x3f800000), below_sqrt2)));
  k = _mm256_add_epi32(k, _mm256_andnot_si256(below_sqrt2, _mm256_set1_epi32(1)));
  hu = _mm256_blendv_epi8(
      _mm256_srai_epi32(_mm256_sub_epi32(_mm256_set1_epi32(0x00800000), hu), 2), hu, below_sqrt2);
  __m256 f = _mm256_sub_ps(normalized, one);
  // unreduced lanes: k = 0, f = x, hu = 1
  const __m256i unreduced = _mm256_cmpgt_epi32(_mm256_set1_epi32(kAbsNoReduction + 1), ax);
  f = _mm256_blendv_ps(f, x, as_ps(unreduced));
  k = _mm256_andnot_si256(unreduced, k);
  hu = _mm256_blendv_epi8(hu, _mm256_set1_epi32(1), unreduced);
  c = _mm256_andnot_ps(as_ps(unreduced), c);

  const __m256 kf = _mm256_cvtepi32_ps(k);
  const __m256 k_is_0 = as_ps(_mm256_cmpeq_epi32(k, _mm256_setzero_si256()));
  const __m256 hfsq = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), f), f);
  const __m256 k_hi = _mm256_mul_ps(kf, _mm256_set1_ps(kLn2Hi));
  const __m256 k_lo_c = _mm256_add_ps(_mm256_mul_ps(kf, _mm256_set1_ps(kLn2Lo)), c);
  // hu != 0: the polynomial in s = f / (2 + f)
  const __m256 s = _mm256_div_ps(f, _mm256_add_ps(_mm256_set1_ps(2.0f), f));
  const __m256 z = _mm256_mul_ps(s, s);
  __m256 r = _mm256_set1_ps(kLp7);
  for (const float coefficient : {kLp6, kLp5, kLp4, kLp3, kLp2, kLp1}) {
    r = _mm256_add_ps(_mm256_set1_ps(coefficient), _mm256_mul_ps(z, r));
  }
  r = _mm256_mul_ps(z, r);
  const __m256 s_hfsq_r = _mm256_mul_ps(s, _mm256_add_ps(hfsq, r));
  const __m256 general = _mm256_blendv_ps(
      _mm256_sub_ps(k_hi, _mm256_sub_ps(_mm256_sub_ps(hfsq, _mm256_add_ps(s_hfsq_r, k_lo_c)), f)),
      _mm256_sub_ps(f, _mm256_sub_ps(hfsq, s_hfsq_r)), k_is_0);
  // hu == 0: |f| < 2^-20
  const __m256 r_small = _mm256_mul_ps(
      hfsq, _mm256_sub_ps(one, _mm256_mul_ps(_mm256_set1_ps(0.66666666666666666f), f)));
  const __m256 small_f = _mm256_blendv_ps(
      _mm256_sub_ps(k_hi, _mm256_sub_ps(_mm256_sub_ps(r_small, k_lo_c), f)), _mm256_sub_ps(f, r_small), k_is_0);
  const __m256 zero_f = _mm256_blendv_ps(_mm256_add_ps(k_hi, k_lo_c), _mm256_setzero_ps(), k_is_0);
  const __m256 tiny_f =
      _mm256_blendv_ps(small_f, zero_f, _mm256_cmp_ps(f, _mm256_setzero_ps(), _CMP_EQ_OQ));
  const __m256 result =
      _mm256_blendv_ps(general, tiny_f, as_ps(_mm256_cmpeq_epi32(hu, _mm256_setzero_si256())));
  // |x| < 2^-29
  const __m256 near_zero = _mm256_blendv_ps(
      _mm256_sub_ps(x, _mm256_mul_ps(_mm256_mul_ps(x, x), _mm256_set1_ps(0.5f))), x,
      as_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(kAbsBelow2p54), ax)));
  return _mm256_blendv_ps(result, near_zero, as_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(kAbsBelow2p29), ax)));
}

// A mask of 32-bit lanes widened to 64-bit lanes.
NPUSIM_AVX2_FMA_INLINE __m256d widened_mask(__m128i mask) {
  return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(mask));
}

// The double sign bit of each lane whose 32-bit mask lane is set.
NPUSIM_AVX2_FMA_INLINE __m256d sign_where(__m128i mask) {
  return _mm256_and_pd(widened_mask(mask), _mm256_set1_pd(-0.0));
}

// cosf_scalar over 4 lanes (|y| < 120).
NPUSIM_AVX2_FMA_INLINE __m128 cosf_avx2(__m128 y) {
  const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_castps_si128(y), 20), _mm_set1_epi32(0x7ff));
  const __m128i unreduced = _mm_cmpgt_epi32(_mm_set1_epi32(kTopBelowQuarterPi), top);
  const __m256d x = _mm256_cvtps_pd(y);
  const __m128i truncated = _mm256_cvttpd_epi32(_mm256_mul_pd(x, _mm256_set1_pd(kHalfPiInverseScaled)));
  const __m128i n = _mm_srai_epi32(_mm_add_epi32(truncated, _mm_set1_epi32(0x800000)), 24);
  const __m256d reduced = _mm256_blendv_pd(
      _mm256_fnmadd_pd(_mm256_cvtepi32_pd(n), _mm256_set1_pd(kHalfPi), x), x, widened_mask(unreduced));
  const __m256d x2 = _mm256_mul_pd(reduced, reduced);
  const __m128i quadrant_bit1 = _mm_cmpeq_epi32(_mm_and_si128(n, _mm_set1_epi32(2)), _mm_set1_epi32(2));
  const __m128i odd = _mm_andnot_si128(
      unreduced, _mm_cmpeq_epi32(_mm_and_si128(n, _mm_set1_epi32(1)), _mm_set1_epi32(1)));
  // odd quadrants: sin, of -reduced in quadrant 1 and of reduced in 3
  const __m256d xs = _mm256_xor_pd(reduced, sign_where(_mm_andnot_si128(quadrant_bit1, _mm_set1_epi32(-1))));
  const __m256d s1 = _mm256_fmadd_pd(x2, _mm256_set1_pd(kS3), _mm256_set1_pd(kS2));
  const __m256d x3 = _mm256_mul_pd(x2, xs);
  const __m256d x7 = _mm256_mul_pd(x3, x2);
  const __m256d sine = _mm256_fmadd_pd(s1, x7, _mm256_fmadd_pd(x3, _mm256_set1_pd(kS1), xs));
  // even quadrants and unreduced lanes: cos, negated in quadrant 2
  const __m256d x4 = _mm256_mul_pd(x2, x2);
  const __m256d c1 = _mm256_fmadd_pd(x2, _mm256_set1_pd(kC1), _mm256_set1_pd(kC0));
  const __m256d c2 = _mm256_fmadd_pd(x2, _mm256_set1_pd(kC4), _mm256_set1_pd(kC3));
  const __m256d x6 = _mm256_mul_pd(x2, x4);
  const __m256d cosine = _mm256_xor_pd(
      _mm256_fmadd_pd(c2, x6, _mm256_fmadd_pd(x4, _mm256_set1_pd(kC2), c1)),
      sign_where(_mm_andnot_si128(unreduced, quadrant_bit1)));
  const __m128 result = _mm256_cvtpd_ps(_mm256_blendv_pd(cosine, sine, widened_mask(odd)));
  return _mm_blendv_ps(result, _mm_set1_ps(1.0f), _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32(kTopBelow2p12), top)));
}

// u = (word >> 8) * 2^-24 over 8 lanes.
NPUSIM_AVX2_FMA_INLINE __m256 unit_floats_avx2(const uint32_t* words) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(w, 8)), _mm256_set1_ps(0x1.0p-24f));
}

NPUSIM_AVX2_FMA void standard_normals_avx2(const PhiloxBatch& batch, int count, float* out) {
  for (int j = 0; j < count; j += 8) {
    // -u as a sign flip: 0 - u would make -0 of u = 0 a +0, and log1pf keeps the sign of a zero
    const __m256 log1p = log1pf_avx2(_mm256_xor_ps(unit_floats_avx2(&batch.x[0][j]), _mm256_set1_ps(-0.0f)));
    const __m256 radius = _mm256_sqrt_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0f), log1p));
    const __m256 angle = _mm256_mul_ps(_mm256_set1_ps(kTwoPi), unit_floats_avx2(&batch.x[2][j]));
    const __m256 cosine = _mm256_set_m128(
        cosf_avx2(_mm256_extractf128_ps(angle, 1)), cosf_avx2(_mm256_castps256_ps128(angle)));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(radius, cosine));
  }
}

// Over n inputs at a time: the log1pf and cosf of the AVX2 form.
NPUSIM_AVX2_FMA void log1pf_and_cosf_avx2(const float* x, const float* y, int n, float* log1p, float* cosine) {
  for (int j = 0; j < n; j += 8) {
    _mm256_storeu_ps(log1p + j, log1pf_avx2(_mm256_loadu_ps(x + j)));
    _mm_storeu_ps(cosine + j, cosf_avx2(_mm_loadu_ps(y + j)));
    _mm_storeu_ps(cosine + j + 4, cosf_avx2(_mm_loadu_ps(y + j + 4)));
  }
}
#undef NPUSIM_AVX2_FMA_INLINE
#undef NPUSIM_AVX2_FMA

// ---- the AVX-512 form: the AVX2 form's operations over twice the lanes ----

#define NPUSIM_AVX512 __attribute__((target("avx512f")))
#define NPUSIM_AVX512_INLINE __attribute__((target("avx512f"), always_inline)) inline

// log1pf_avx2 over 16 lanes.
NPUSIM_AVX512_INLINE __m512 log1pf_avx512(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i ax = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  const __m512 u = _mm512_add_ps(one, x);
  __m512i hu = _mm512_castps_si512(u);
  __m512i k = _mm512_sub_epi32(_mm512_srai_epi32(hu, 23), _mm512_set1_epi32(127));
  const __m512 c_above = _mm512_sub_ps(one, _mm512_sub_ps(u, x));
  const __m512 c_below = _mm512_sub_ps(x, _mm512_sub_ps(u, one));
  __m512 c = _mm512_div_ps(
      _mm512_mask_blend_ps(_mm512_cmpgt_epi32_mask(k, _mm512_setzero_si512()), c_below, c_above), u);
  hu = _mm512_and_si512(hu, _mm512_set1_epi32(0x007fffff));
  const __mmask16 below_sqrt2 = _mm512_cmplt_epi32_mask(hu, _mm512_set1_epi32(kMantissaBelowSqrt2));
  const __m512 normalized = _mm512_castsi512_ps(_mm512_or_si512(
      hu, _mm512_mask_blend_epi32(below_sqrt2, _mm512_set1_epi32(0x3f000000), _mm512_set1_epi32(0x3f800000))));
  k = _mm512_mask_add_epi32(k, static_cast<__mmask16>(~below_sqrt2), k, _mm512_set1_epi32(1));
  hu = _mm512_mask_blend_epi32(
      below_sqrt2, _mm512_srai_epi32(_mm512_sub_epi32(_mm512_set1_epi32(0x00800000), hu), 2), hu);
  __m512 f = _mm512_sub_ps(normalized, one);
  const __mmask16 unreduced = _mm512_cmple_epi32_mask(ax, _mm512_set1_epi32(kAbsNoReduction));
  f = _mm512_mask_blend_ps(unreduced, f, x);
  k = _mm512_mask_blend_epi32(unreduced, k, _mm512_setzero_si512());
  hu = _mm512_mask_blend_epi32(unreduced, hu, _mm512_set1_epi32(1));
  c = _mm512_mask_blend_ps(unreduced, c, _mm512_setzero_ps());

  const __m512 kf = _mm512_cvtepi32_ps(k);
  const __mmask16 k_is_0 = _mm512_cmpeq_epi32_mask(k, _mm512_setzero_si512());
  const __m512 hfsq = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), f), f);
  const __m512 k_hi = _mm512_mul_ps(kf, _mm512_set1_ps(kLn2Hi));
  const __m512 k_lo_c = _mm512_add_ps(_mm512_mul_ps(kf, _mm512_set1_ps(kLn2Lo)), c);
  const __m512 s = _mm512_div_ps(f, _mm512_add_ps(_mm512_set1_ps(2.0f), f));
  const __m512 z = _mm512_mul_ps(s, s);
  __m512 r = _mm512_set1_ps(kLp7);
  for (const float coefficient : {kLp6, kLp5, kLp4, kLp3, kLp2, kLp1}) {
    r = _mm512_add_ps(_mm512_set1_ps(coefficient), _mm512_mul_ps(z, r));
  }
  r = _mm512_mul_ps(z, r);
  const __m512 s_hfsq_r = _mm512_mul_ps(s, _mm512_add_ps(hfsq, r));
  const __m512 general = _mm512_mask_blend_ps(k_is_0,
      _mm512_sub_ps(k_hi, _mm512_sub_ps(_mm512_sub_ps(hfsq, _mm512_add_ps(s_hfsq_r, k_lo_c)), f)),
      _mm512_sub_ps(f, _mm512_sub_ps(hfsq, s_hfsq_r)));
  const __m512 r_small = _mm512_mul_ps(
      hfsq, _mm512_sub_ps(one, _mm512_mul_ps(_mm512_set1_ps(0.66666666666666666f), f)));
  const __m512 small_f = _mm512_mask_blend_ps(k_is_0,
      _mm512_sub_ps(k_hi, _mm512_sub_ps(_mm512_sub_ps(r_small, k_lo_c), f)), _mm512_sub_ps(f, r_small));
  const __m512 zero_f = _mm512_mask_blend_ps(k_is_0, _mm512_add_ps(k_hi, k_lo_c), _mm512_setzero_ps());
  const __m512 tiny_f =
      _mm512_mask_blend_ps(_mm512_cmp_ps_mask(f, _mm512_setzero_ps(), _CMP_EQ_OQ), small_f, zero_f);
  const __m512 result =
      _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(hu, _mm512_setzero_si512()), general, tiny_f);
  const __m512 near_zero = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(ax, _mm512_set1_epi32(kAbsBelow2p54)),
      _mm512_sub_ps(x, _mm512_mul_ps(_mm512_mul_ps(x, x), _mm512_set1_ps(0.5f))), x);
  return _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(ax, _mm512_set1_epi32(kAbsBelow2p29)), result, near_zero);
}

// `v` with its sign flipped in the lanes of `mask`.
NPUSIM_AVX512_INLINE __m512d negated_where(__mmask8 mask, __m512d v) {
  return _mm512_castsi512_pd(_mm512_mask_xor_epi64(
      _mm512_castpd_si512(v), mask, _mm512_castpd_si512(v), _mm512_set1_epi64(INT64_MIN)));
}

// cosf_avx2 over 8 lanes; the 32-bit lanes are widened to 64 bits for masks.
NPUSIM_AVX512_INLINE __m256 cosf_avx512(__m256 y) {
  const __m512i top = _mm512_and_si512(
      _mm512_srli_epi64(_mm512_cvtepu32_epi64(_mm256_castps_si256(y)), 20), _mm512_set1_epi64(0x7ff));
  const __mmask8 unreduced = _mm512_cmplt_epu64_mask(top, _mm512_set1_epi64(kTopBelowQuarterPi));
  const __m512d x = _mm512_cvtps_pd(y);
  const __m256i truncated = _mm512_cvttpd_epi32(_mm512_mul_pd(x, _mm512_set1_pd(kHalfPiInverseScaled)));
  const __m256i n32 = _mm256_srai_epi32(_mm256_add_epi32(truncated, _mm256_set1_epi32(0x800000)), 24);
  const __m512i n = _mm512_cvtepi32_epi64(n32);
  const __m512d reduced = _mm512_mask_blend_pd(
      unreduced, _mm512_fnmadd_pd(_mm512_cvtepi32_pd(n32), _mm512_set1_pd(kHalfPi), x), x);
  const __m512d x2 = _mm512_mul_pd(reduced, reduced);
  const __mmask8 quadrant_bit1 = _mm512_test_epi64_mask(n, _mm512_set1_epi64(2));
  const __mmask8 odd = static_cast<__mmask8>(~unreduced & _mm512_test_epi64_mask(n, _mm512_set1_epi64(1)));
  const __m512d xs = negated_where(static_cast<__mmask8>(~quadrant_bit1), reduced);
  const __m512d s1 = _mm512_fmadd_pd(x2, _mm512_set1_pd(kS3), _mm512_set1_pd(kS2));
  const __m512d x3 = _mm512_mul_pd(x2, xs);
  const __m512d x7 = _mm512_mul_pd(x3, x2);
  const __m512d sine = _mm512_fmadd_pd(s1, x7, _mm512_fmadd_pd(x3, _mm512_set1_pd(kS1), xs));
  const __m512d x4 = _mm512_mul_pd(x2, x2);
  const __m512d c1 = _mm512_fmadd_pd(x2, _mm512_set1_pd(kC1), _mm512_set1_pd(kC0));
  const __m512d c2 = _mm512_fmadd_pd(x2, _mm512_set1_pd(kC4), _mm512_set1_pd(kC3));
  const __m512d x6 = _mm512_mul_pd(x2, x4);
  const __m512d cosine = negated_where(static_cast<__mmask8>(~unreduced & quadrant_bit1),
      _mm512_fmadd_pd(c2, x6, _mm512_fmadd_pd(x4, _mm512_set1_pd(kC2), c1)));
  const __m256 result = _mm512_cvtpd_ps(_mm512_mask_blend_pd(odd, cosine, sine));
  const __mmask8 tiny = _mm512_cmplt_epu64_mask(top, _mm512_set1_epi64(kTopBelow2p12));
  return _mm512_castps512_ps256(
      _mm512_mask_blend_ps(tiny, _mm512_castps256_ps512(result), _mm512_set1_ps(1.0f)));
}

NPUSIM_AVX512_INLINE __m512 unit_floats_avx512(__mmask16 lanes, const uint32_t* words) {
  const __m512i w = _mm512_maskz_loadu_epi32(lanes, words);
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(w, 8)), _mm512_set1_ps(0x1.0p-24f));
}

NPUSIM_AVX512 void standard_normals_avx512(const PhiloxBatch& batch, int count, float* out) {
  for (int j = 0; j < count; j += 16) {
    // the lanes j .. count - 1 of this vector: no lane past count is read or written
    const __mmask16 lanes = count - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (count - j)) - 1);
    const __m512 log1p = log1pf_avx512(_mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(unit_floats_avx512(lanes, &batch.x[0][j])), _mm512_set1_epi32(INT32_MIN))));
    const __m512 radius = _mm512_sqrt_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0f), log1p));
    const __m512 angle = _mm512_mul_ps(_mm512_set1_ps(kTwoPi), unit_floats_avx512(lanes, &batch.x[2][j]));
    // halves moved as 4 doubles: the 8-float inserts and extracts are AVX512DQ's
    const __m256 high = cosf_avx512(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(angle), 1)));
    const __m512 cosine = _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castps_pd(_mm512_castps256_ps512(cosf_avx512(_mm512_castps512_ps256(angle)))),
        _mm256_castps_pd(high), 1));
    _mm512_mask_storeu_ps(out + j, lanes, _mm512_mul_ps(radius, cosine));
  }
}

NPUSIM_AVX512 void log1pf_and_cosf_avx512(const float* x, const float* y, int n, float* log1p, float* cosine) {
  for (int j = 0; j < n; j += 16) {
    _mm512_storeu_ps(log1p + j, log1pf_avx512(_mm512_loadu_ps(x + j)));
    _mm256_storeu_ps(cosine + j, cosf_avx512(_mm256_loadu_ps(y + j)));
    _mm256_storeu_ps(cosine + j + 8, cosf_avx512(_mm256_loadu_ps(y + j + 8)));
  }
}
#undef NPUSIM_AVX512_INLINE
#undef NPUSIM_AVX512
#endif

// The forms; a machine without a form's instructions never takes it.
enum class BoxMullerForm { kPortable, kAvx2, kAvx512 };

bool machine_has(BoxMullerForm form) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  switch (form) {
    case BoxMullerForm::kAvx512:
      return avx512;
    case BoxMullerForm::kAvx2:
      return avx2;
    case BoxMullerForm::kPortable:
      return true;
  }
#endif
  return form == BoxMullerForm::kPortable;
}

BoxMullerForm best_box_muller_form() {
  static const BoxMullerForm form = machine_has(BoxMullerForm::kAvx512) ? BoxMullerForm::kAvx512
      : machine_has(BoxMullerForm::kAvx2)                               ? BoxMullerForm::kAvx2
                                                                        : BoxMullerForm::kPortable;
  return form;
}

// log1pf of x[0 .. n) and cosf of y[0 .. n) in `form` (n a multiple of 16).
void log1pf_and_cosf_in(BoxMullerForm form, const float* x, const float* y, int n, float* log1p, float* cosine) {
  switch (form) {
#if defined(__x86_64__) && defined(__GNUC__)
    case BoxMullerForm::kAvx512:
      log1pf_and_cosf_avx512(x, y, n, log1p, cosine);
      return;
    case BoxMullerForm::kAvx2:
      log1pf_and_cosf_avx2(x, y, n, log1p, cosine);
      return;
#endif
    default:
      for (int j = 0; j < n; ++j) {
        log1p[j] = log1pf_scalar(x[j]);
        cosine[j] = cosf_scalar(y[j]);
      }
  }
}

}  // namespace glibc_float
}  // namespace

void standard_normal_floats(const PhiloxBatch& batch, int count, float* out) {
  using namespace glibc_float;
  switch (best_box_muller_form()) {
#if defined(__x86_64__) && defined(__GNUC__)
    case BoxMullerForm::kAvx512:
      standard_normals_avx512(batch, count, out);
      return;
    case BoxMullerForm::kAvx2:
      standard_normals_avx2(batch, count, out);
      return;
#endif
    default:
      standard_normals_portable(batch, count, out);
  }
}

bool box_muller_mismatches(const char* form, const char* reference, int64_t& log1p_mismatches,
    int64_t& cos_mismatches) {
  using namespace glibc_float;
  BoxMullerForm chosen = best_box_muller_form();
  if (std::strcmp(form, "portable") == 0) {
    chosen = BoxMullerForm::kPortable;
  } else if (std::strcmp(form, "avx2") == 0) {
    chosen = BoxMullerForm::kAvx2;
  } else if (std::strcmp(form, "avx512") == 0) {
    chosen = BoxMullerForm::kAvx512;
  } else if (std::strcmp(form, "auto") != 0) {
    return false;
  }
  const bool libm = std::strcmp(reference, "libm") == 0;
  if (!machine_has(chosen) || (!libm && std::strcmp(reference, "portable") != 0)) {
    return false;
  }
  constexpr int kChunk = 1 << 16;
  std::vector<float> x(kChunk), y(kChunk), log1p(kChunk), cosine(kChunk);
  int64_t log1p_differ = 0;
  int64_t cos_differ = 0;
  for (uint32_t start = 0; start < (1u << 24); start += kChunk) {
    for (int j = 0; j < kChunk; ++j) {
      const float u = unit_float((start + static_cast<uint32_t>(j)) << 8);
      x[j] = -u;
      y[j] = kTwoPi * u;
    }
    log1pf_and_cosf_in(chosen, x.data(), y.data(), kChunk, log1p.data(), cosine.data());
    for (int j = 0; j < kChunk; ++j) {
      const float want_log1p = libm ? ::log1pf(x[j]) : log1pf_scalar(x[j]);
      const float want_cos = libm ? ::cosf(y[j]) : cosf_scalar(y[j]);
      log1p_differ += c10::bit_cast<uint32_t>(log1p[j]) != c10::bit_cast<uint32_t>(want_log1p);
      cos_differ += c10::bit_cast<uint32_t>(cosine[j]) != c10::bit_cast<uint32_t>(want_cos);
    }
  }
  log1p_mismatches = log1p_differ;
  cos_mismatches = cos_differ;
  return true;
}

}  // namespace npusim
