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

// Hash codes of kHadamardRows rows at once, one row per vector lane:
// input [p, kHadamardRows] (padded rows) -> lane_codes [m, kHadamardRows].
// Block q of the projection is H D3 H D2 H D1 input, D_s = diag(signs[q, s]) and
// H the unnormalized fast Walsh-Hadamard transform (Sylvester order, p a power
// of two); bit i of hash h is the sign of projection row HadamardProjectionRow(d,
// h*tau+i) (yoso_common.h: contiguous or interleaved across blocks). Run in
// double: the +-1 sums of float32 inputs are then exact, so a structural zero
// stays exactly 0 (bit 0) on every implementation and vector width.
// signs [num_blocks, 3, p] as double; projected: scratch [num_blocks, p, kHadamardRows].
KY_CPU_CLONES inline void HadamardCodes(const HashDims& d, const double* signs,
                                        const double* input, double* projected,
                                        int32_t* lane_codes) {
  constexpr int64_t kRows = kHadamardRows;
  const int64_t p = d.padded_dim;
  for (int64_t q = 0; q < d.num_blocks; ++q) {
    double* y = projected + q * p * kRows;
    std::copy(input, input + p * kRows, y);
    for (int64_t stage = 0; stage < 3; ++stage) {
      const double* s = signs + (q * 3 + stage) * p;
      if (p == 1) {
        for (int64_t r = 0; r < kRows; ++r) y[r] *= s[0];
        continue;
      }
      // H's butterflies of width 1, with D's signs applied to their inputs (exact).
      for (int64_t j = 0; j < p; j += 2) {
        double* lo = y + j * kRows;
        double* hi = lo + kRows;
        const double sign_lo = s[j], sign_hi = s[j + 1];
        for (int64_t r = 0; r < kRows; ++r) {
          const double a = lo[r] * sign_lo, b = hi[r] * sign_hi;
          lo[r] = a + b;
          hi[r] = a - b;
        }
      }
      // Then widths len and 2 len together, one pass over each group of four entries.
      int64_t len = 2;
      for (; 2 * len < p; len *= 4) {
        for (int64_t i = 0; i < p; i += 4 * len) {
          for (int64_t j = i; j < i + len; ++j) {
            double* y0 = y + j * kRows;
            double* y1 = y0 + len * kRows;
            double* y2 = y1 + len * kRows;
            double* y3 = y2 + len * kRows;
            for (int64_t r = 0; r < kRows; ++r) {
              const double b0 = y0[r] + y1[r], b1 = y0[r] - y1[r];
              const double b2 = y2[r] + y3[r], b3 = y2[r] - y3[r];
              y0[r] = b0 + b2;
              y2[r] = b0 - b2;
              y1[r] = b1 + b3;
              y3[r] = b1 - b3;
            }
          }
        }
      }
      if (len < p) {  // a last width-len pass when log2(p) is even
        for (int64_t j = 0; j < len; ++j) {
          double* lo = y + j * kRows;
          double* hi = lo + len * kRows;
          for (int64_t r = 0; r < kRows; ++r) {
            const double a = lo[r], b = hi[r];
            lo[r] = a + b;
            hi[r] = a - b;
          }
        }
      }
    }
  }
  for (int64_t h = 0; h < d.num_hashes; ++h) {
    int32_t* code = lane_codes + h * kRows;
    for (int64_t r = 0; r < kRows; ++r) code[r] = 0;
    for (int64_t i = 0; i < d.hash_code_len; ++i) {
      const double* bit = projected + HadamardProjectionRow(d, h * d.hash_code_len + i) * kRows;
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
         internal::HadamardCodes(d, signs_f64.data(), input.data(), projected.data(),
                                 lane_codes.data());
         for (int64_t r = 0; r < count; ++r) {
           const int64_t b = (row0 + r) / d.length, n = (row0 + r) % d.length;
           int32_t* row_codes = codes + b * d.num_hashes * d.length + n;
           for (int64_t h = 0; h < d.num_hashes; ++h) {
             row_codes[h * d.length] = lane_codes[h * kRows + r];
           }
         }
       }
     });
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_HASH_CPU_H_
