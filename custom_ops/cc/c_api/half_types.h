// float16 and bfloat16 storage types for the C ABI: yoso_cpu.h needs only a static_cast to and
// from float (all sums are float32). Conversions round to nearest even; NaN stays NaN, overflow
// becomes infinity, as in IEEE 754 and in Eigen's half and bfloat16 (which the TensorFlow op
// kernels use), so every backend rounds the outputs alike.
#ifndef KERAS_YOSO_C_API_HALF_TYPES_H_
#define KERAS_YOSO_C_API_HALF_TYPES_H_

#include <cstdint>
#include <cstring>

namespace keras_yoso {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

struct Half {
  uint16_t bits;
  Half() = default;
  explicit Half(float f) : bits(FromFloat(f)) {}
  explicit operator float() const { return ToFloat(bits); }

  static uint16_t FromFloat(float f) {
    const uint32_t u = FloatBits(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) {  // inf or NaN (a quiet NaN keeps some payload)
      return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
    if (abs < 0x38800000u) {  // below the smallest normal half: a subnormal or zero
      // value * 2^24 rounded to nearest even is the subnormal's mantissa.
      const float scaled = BitsFloat(abs) * 16777216.0f;
      const uint32_t mant = static_cast<uint32_t>(scaled);
      const float rest = scaled - static_cast<float>(mant);
      const uint32_t rounded = mant + (rest > 0.5f || (rest == 0.5f && (mant & 1u)));
      return static_cast<uint16_t>(sign | rounded);
    }
    // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
    const uint32_t shifted = abs - 0x38000000u;
    const uint32_t rounded = shifted + 0xFFFu + ((shifted >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }

  static float ToFloat(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
      const float value = static_cast<float>(mant) * (1.0f / 16777216.0f);
      return BitsFloat(sign | FloatBits(value));
    }
    if (exp == 0x1Fu) return BitsFloat(sign | 0x7F800000u | (mant << 13));
    return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};

struct BFloat16 {
  uint16_t bits;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(FromFloat(f)) {}
  explicit operator float() const { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

  static uint16_t FromFloat(float f) {
    const uint32_t u = FloatBits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "16-bit storage types");

}  // namespace keras_yoso

#endif  // KERAS_YOSO_C_API_HALF_TYPES_H_
