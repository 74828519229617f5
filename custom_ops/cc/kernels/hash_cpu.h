// Sign-random-projection hash codes on the CPU (appendix §1.2): the Gaussian projection and the
// fast Hadamard transform.
#ifndef KERAS_YOSO_KERNELS_HASH_CPU_H_
#define KERAS_YOSO_KERNELS_HASH_CPU_H_

#include "cpu_tiles.h"

namespace keras_yoso {
// Packs sign bits bits[0, m*tau) (bit i of hash h at h*tau+i) into codes[h * stride].
template <typename F>
void PackSignBits(const F* projected, const HashDims& d, int32_t* codes, int64_t stride) {
  for (int64_t h = 0; h < d.num_hashes; ++h) {
    int32_t code = 0;
    for (int64_t i = 0; i < d.hash_code_len; ++i) {
      code |= static_cast<int32_t>(projected[h * d.hash_code_len + i] > F(0)) << i;
    }
    codes[h * stride] = code;
  }
}

// Dense Gaussian hyperplane LSH (appendix §1.2, F(x) = sign(Px)).
// x [B, N, d], projection [d, m*tau] -> codes [B, m, N].
template <typename T, typename ParallelFor>
void GaussianHashCodesCpu(const HashDims& d, const T* x, const float* projection,
                          int32_t* codes, ParallelFor&& pf) {
  const int64_t bits = d.num_hashes * d.hash_code_len;
  pf(d.batch * d.length, 2 * d.dim * bits + 1, [&](int64_t begin, int64_t end) {
    std::vector<float> projected(bits);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / d.length, n = row % d.length;
      std::fill(projected.begin(), projected.end(), 0.0f);
      const T* xr = x + row * d.dim;
      for (int64_t c = 0; c < d.dim; ++c) {
        const float xc = static_cast<float>(xr[c]);
        const float* p = projection + c * bits;
        for (int64_t k = 0; k < bits; ++k) projected[k] += xc * p[k];
      }
      PackSignBits(projected.data(), d, codes + b * d.num_hashes * d.length + n, d.length);
    }
  });
}

namespace internal {

// Rows that HadamardHashCodesCpu transforms together, one per vector lane.
constexpr int64_t kHadamardRows = 8;

// One pass of the fast Walsh-Hadamard transform over y [p, kHadamardRows] (one row per vector lane):
// the butterfly levels of widths len, 2 len, ..., 2^(kLevels-1) len, each group of 2^kLevels
// entries loaded once into registers, combined and stored once. The entries are read from src
// (times signs[entry] when kSigned: D's signs applied to H's inputs, exact) and written to y. Every level pairs the same operands as the one-level-at-a-time transform, so the result
// is the same whatever the grouping of levels into passes. A function of its own, compiled for
// each x86-64 level: inlined into HadamardCodes, GCC spilled the entries to the stack (1.7x slower).
template <int kLevels, bool kSigned>
KY_CPU_CLONES KY_NOINLINE void HadamardPass(const double* src, const double* signs, double* y, int64_t p, int64_t len) {
  constexpr int64_t kRows = kHadamardRows;
  constexpr int kPoints = 1 << kLevels;
  for (int64_t i = 0; i < p; i += kPoints * len) {
    for (int64_t j = i; j < i + len; ++j) {
      double v[kPoints][kRows];
      KY_UNROLL for (int t = 0; t < kPoints; ++t) {
        const double* in = src + (j + t * len) * kRows;
        if constexpr (kSigned) {
          const double sign = signs[j + t * len];
          KY_UNROLL for (int64_t r = 0; r < kRows; ++r) v[t][r] = in[r] * sign;
        } else {
          KY_UNROLL for (int64_t r = 0; r < kRows; ++r) v[t][r] = in[r];
        }
      }
      KY_UNROLL for (int level = 0; level < kLevels; ++level) {
        const int half = 1 << level;
        KY_UNROLL for (int t = 0; t < kPoints; ++t) {
          if (t & half) continue;
          KY_UNROLL for (int64_t r = 0; r < kRows; ++r) {
            const double a = v[t][r], b = v[t + half][r];
            v[t][r] = a + b;
            v[t + half][r] = a - b;
          }
        }
      }
      KY_UNROLL for (int t = 0; t < kPoints; ++t) {
        double* out = y + (j + t * len) * kRows;
        KY_UNROLL for (int64_t r = 0; r < kRows; ++r) out[r] = v[t][r];
      }
    }
  }
}

// Hash codes of kHadamardRows rows at once, one row per vector lane:
// input [p, kHadamardRows] (padded rows) -> lane_codes [m, kHadamardRows].
// Block q of the projection is H D3 H D2 H D1 input, D_s = diag(signs[q, s]) and
// H the unnormalized fast Walsh-Hadamard transform (Sylvester order, p a power
// of two); bit k = h*tau+i of hash h is the sign of projection row bit_rows[k] =
// HadamardProjectionRow(d, k) (yoso_common.h: contiguous or interleaved across blocks). Run
// in double: the +-1 sums of float32 inputs are then exact, so a structural zero
// stays exactly 0 (bit 0) on every implementation and vector width.
// Each H is log2(p) butterfly levels in passes of three (eight entries per lane in registers),
// the first of each H applying that stage's signs as it reads.
// signs [num_blocks, 3, p] as double; projected: scratch [num_blocks, p, kHadamardRows].
KY_CPU_CLONES inline void HadamardCodes(const HashDims& d, const double* signs, const int64_t* bit_rows,
                                        const double* input, double* projected, int32_t* lane_codes) {
  constexpr int64_t kRows = kHadamardRows;
  const int64_t p = d.padded_dim;
  for (int64_t q = 0; q < d.num_blocks; ++q) {
    double* y = projected + q * p * kRows;
    for (int64_t stage = 0; stage < 3; ++stage) {
      const double* s = signs + (q * 3 + stage) * p;
      const double* src = stage == 0 ? input : y;
      if (p == 1) {
        for (int64_t r = 0; r < kRows; ++r) y[r] = src[r] * s[0];
        continue;
      }
      // The first pass reads src with the signs; the others transform y in place.
      int64_t len = p >= 8 ? 8 : p;
      if (p >= 8) {
        HadamardPass<3, true>(src, s, y, p, 1);
      } else if (p == 4) {
        HadamardPass<2, true>(src, s, y, p, 1);
      } else {
        HadamardPass<1, true>(src, s, y, p, 1);
      }
      for (; len < p;) {
        if (8 * len <= p) {
          HadamardPass<3, false>(y, nullptr, y, p, len);
          len *= 8;
        } else if (4 * len <= p) {
          HadamardPass<2, false>(y, nullptr, y, p, len);
          len *= 4;
        } else {
          HadamardPass<1, false>(y, nullptr, y, p, len);
          len *= 2;
        }
      }
    }
  }
  for (int64_t h = 0; h < d.num_hashes; ++h) {
    int32_t* code = lane_codes + h * kRows;
    for (int64_t r = 0; r < kRows; ++r) code[r] = 0;
    for (int64_t i = 0; i < d.hash_code_len; ++i) {
      const double* bit = projected + bit_rows[h * d.hash_code_len + i] * kRows;
      for (int64_t r = 0; r < kRows; ++r) code[r] |= static_cast<int32_t>(bit[r] > 0.0) << i;
    }
  }
}

}  // namespace internal

// Fast Hadamard LSH (appendix §1.2): block q gives sign(H D3 H D2 H D1 pad(x)).
// x [B, N, d], signs [num_blocks, 3, padded_dim] -> codes [B, m, N].
// Rows are transformed kHadamardRows at a time, one per vector lane.
template <typename T, typename ParallelFor>
void HadamardHashCodesCpu(const HashDims& d, const T* x, const float* signs, int32_t* codes,
                          ParallelFor&& pf) {
  constexpr int64_t kRows = internal::kHadamardRows;
  const int64_t p = d.padded_dim, rows = d.batch * d.length;
  int64_t log_p = 0;
  while ((int64_t{1} << log_p) < p) ++log_p;
  const std::vector<double> signs_f64(signs, signs + d.num_blocks * 3 * p);
  std::vector<int64_t> bit_rows(d.num_hashes * d.hash_code_len);
  for (int64_t k = 0; k < static_cast<int64_t>(bit_rows.size()); ++k) bit_rows[k] = HadamardProjectionRow(d, k);
  pf((rows + kRows - 1) / kRows, kRows * d.num_blocks * 3 * p * (log_p + 1) + 1,
     [&](int64_t begin, int64_t end) {
       std::vector<double> input(p * kRows), projected(d.num_blocks * p * kRows);
       std::vector<int32_t> lane_codes(d.num_hashes * kRows);
       for (int64_t group = begin; group < end; ++group) {
         const int64_t row0 = group * kRows, count = std::min(kRows, rows - row0);
         std::fill(input.begin(), input.end(), 0.0);
         for (int64_t r = 0; r < count; ++r) {
           const T* xr = x + (row0 + r) * d.dim;
           for (int64_t c = 0; c < d.dim; ++c) input[c * kRows + r] = static_cast<float>(xr[c]);
         }
         internal::HadamardCodes(d, signs_f64.data(), bit_rows.data(), input.data(), projected.data(),
                                 lane_codes.data());
         // Hash by hash, the group's rows of one batch row are neighbours in codes [B, m, N].
         for (int64_t r0 = 0; r0 < count;) {
           const int64_t b = (row0 + r0) / d.length, n0 = (row0 + r0) % d.length;
           const int64_t run = std::min(count - r0, d.length - n0);
           int32_t* run_codes = codes + b * d.num_hashes * d.length + n0;
           for (int64_t h = 0; h < d.num_hashes; ++h) {
             for (int64_t r = 0; r < run; ++r) run_codes[h * d.length + r] = lane_codes[h * kRows + r0 + r];
           }
           r0 += run;
         }
       }
     });
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_HASH_CPU_H_
