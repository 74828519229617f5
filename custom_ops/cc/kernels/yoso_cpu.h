// CPU algorithms of the keras-yoso ops: plain C++ templates over raw pointers.
// No TensorFlow include; the TF wrappers (yoso_kernels.cc) pass a ParallelFor
// that runs on TF's worker pool.
//
// ParallelFor is any callable `pf(int64_t units, int64_t cost_per_unit,
// std::function<void(int64_t begin, int64_t end)>)` that runs every unit in
// [0, units) exactly once. Each unit writes a disjoint part of the output in a
// fixed order, so results are bitwise identical for any number of threads.
// Element type T is float, Eigen::half or Eigen::bfloat16 (anything with
// static_cast to and from float); all sums are float32.
#ifndef KERAS_YOSO_KERNELS_YOSO_CPU_H_
#define KERAS_YOSO_KERNELS_YOSO_CPU_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "yoso_common.h"

namespace keras_yoso {

// Floats of one CPU worker's bucket table; column blocks are sized to fit it.
constexpr int64_t kCpuTableFloats = int64_t{1} << 20;

// Number of codes in codes[0, count) outside [0, num_buckets).
inline int64_t CountInvalidCodes(const int32_t* codes, int64_t count, int64_t num_buckets) {
  int64_t invalid = 0;
  for (int64_t i = 0; i < count; ++i) invalid += (codes[i] < 0 || codes[i] >= num_buckets);
  return invalid;
}

// In-place unnormalized fast Walsh-Hadamard transform (Sylvester order), n a power of two.
// Run in double: the +-1 sums of float32 inputs are then exact, so a structural
// zero of H D3 H D2 H D1 x stays exactly 0 (bit 0) on every implementation.
inline void FastHadamardTransform(double* y, int64_t n) {
  for (int64_t len = 1; len < n; len <<= 1) {
    for (int64_t i = 0; i < n; i += 2 * len) {
      for (int64_t j = i; j < i + len; ++j) {
        const double a = y[j], b = y[j + len];
        y[j] = a + b;
        y[j + len] = a - b;
      }
    }
  }
}

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

// Fast Hadamard LSH (appendix §1.2): block q gives sign(H D3 H D2 H D1 pad(x)).
// x [B, N, d], signs [num_blocks, 3, padded_dim] -> codes [B, m, N].
template <typename T, typename ParallelFor>
void HadamardHashCodesCpu(const HashDims& d, const T* x, const float* signs, int32_t* codes,
                          ParallelFor&& pf) {
  const int64_t p = d.padded_dim;
  int64_t log_p = 0;
  while ((int64_t{1} << log_p) < p) ++log_p;
  pf(d.batch * d.length, d.num_blocks * 3 * p * (log_p + 1) + 1, [&](int64_t begin, int64_t end) {
    std::vector<double> projected(d.num_blocks * p);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / d.length, n = row % d.length;
      const T* xr = x + row * d.dim;
      for (int64_t q = 0; q < d.num_blocks; ++q) {
        double* y = projected.data() + q * p;
        for (int64_t c = 0; c < p; ++c) y[c] = c < d.dim ? static_cast<float>(xr[c]) : 0.0;
        for (int64_t stage = 0; stage < 3; ++stage) {
          const float* s = signs + (q * 3 + stage) * p;
          for (int64_t c = 0; c < p; ++c) y[c] *= s[c];
          FastHadamardTransform(y, p);
        }
      }
      PackSignBits(projected.data(), d, codes + b * d.num_hashes * d.length + n, d.length);
    }
  });
}

namespace internal {

// Column block of the value dimension so one [num_buckets, width] table fits kCpuTableFloats.
inline int64_t ValueColumnBlock(int64_t num_buckets, int64_t value_dim, int64_t rows_per_bucket) {
  const int64_t fit = kCpuTableFloats / (num_buckets * rows_per_bucket);
  return std::max<int64_t>(1, std::min<int64_t>(value_dim, std::min<int64_t>(fit, 64)));
}

inline bool ValidCode(int32_t code, int64_t num_buckets) {
  return code >= 0 && code < num_buckets;
}

// Shared driver of the two table-based cumulations. For each unit (b, value
// column block [c0, c0 + width)) and each hash h, Scatter(table, j, h) adds key
// j into its bucket row, Gather(acc, table, i, h) reads query i's bucket row,
// and the rows keys touched are zeroed again (O(Nk) instead of O(num_buckets)).
template <typename T, typename ScatterFn, typename GatherFn, typename ParallelFor>
void TableCumulation(const CumulationDims& d, int64_t table_width, int64_t width,
                     const float* query_mask, const int32_t* query_codes, const float* key_mask,
                     const int32_t* key_codes, T* out, ScatterFn scatter, GatherFn gather,
                     ParallelFor&& pf) {
  const int64_t blocks = (d.value_dim + width - 1) / width;
  const int64_t cost = d.num_hashes * (d.num_queries + d.num_keys) * table_width * 2 + 1;
  pf(d.batch * blocks, cost, [&](int64_t begin, int64_t end) {
    std::vector<float> table(d.num_buckets * table_width, 0.0f);
    std::vector<float> acc;
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / blocks;
      const int64_t c0 = (unit % blocks) * width;
      const int64_t wc = std::min(width, d.value_dim - c0);
      acc.assign(d.num_queries * wc, 0.0f);
      const float* qm = query_mask + b * d.num_queries;
      const float* km = key_mask + b * d.num_keys;
      for (int64_t h = 0; h < d.num_hashes; ++h) {
        const int32_t* qc = query_codes + (b * d.num_hashes + h) * d.num_queries;
        const int32_t* kc = key_codes + (b * d.num_hashes + h) * d.num_keys;
        for (int64_t j = 0; j < d.num_keys; ++j) {
          if (km[j] == 0.0f || !ValidCode(kc[j], d.num_buckets)) continue;
          scatter(table.data() + kc[j] * table_width, b, j, c0, wc);
        }
        for (int64_t i = 0; i < d.num_queries; ++i) {
          if (qm[i] == 0.0f || !ValidCode(qc[i], d.num_buckets)) continue;
          gather(acc.data() + i * wc, table.data() + qc[i] * table_width, b, i, wc);
        }
        for (int64_t j = 0; j < d.num_keys; ++j) {
          if (km[j] == 0.0f || !ValidCode(kc[j], d.num_buckets)) continue;
          std::fill_n(table.data() + kc[j] * table_width, table_width, 0.0f);
        }
      }
      const float scale = 1.0f / static_cast<float>(d.num_hashes);
      for (int64_t i = 0; i < d.num_queries; ++i) {
        T* o = out + (b * d.num_queries + i) * d.value_dim + c0;
        const float s = qm[i] != 0.0f ? scale : 0.0f;
        for (int64_t c = 0; c < wc; ++c) o[c] = static_cast<T>(acc[i * wc + c] * s);
      }
    }
  });
}

}  // namespace internal

// LSH cumulation, YOSO eq. 2 averaged over m hashes (paper §3.2, Figure 3):
// out[b,i] = qmask[b,i] / m * sum_h sum_j kmask[b,j] [qc[b,h,i] == kc[b,h,j]] value[b,j].
// query_codes [B, m, Nq], key_codes [B, m, Nk], masks [B, N], value [B, Nk, D] -> out [B, Nq, D].
// Time O(B m (Nq + Nk) D); memory one [2^tau, <=64] float table per worker.
template <typename T, typename ParallelFor>
void LshCumulationCpu(const CumulationDims& d, const float* query_mask,
                      const int32_t* query_codes, const float* key_mask,
                      const int32_t* key_codes, const T* value, T* out, ParallelFor&& pf) {
  const int64_t width = internal::ValueColumnBlock(d.num_buckets, d.value_dim, 1);
  auto scatter = [&](float* row, int64_t b, int64_t j, int64_t c0, int64_t wc) {
    const T* v = value + (b * d.num_keys + j) * d.value_dim + c0;
    for (int64_t c = 0; c < wc; ++c) row[c] += static_cast<float>(v[c]);
  };
  auto gather = [](float* acc, const float* row, int64_t, int64_t, int64_t wc) {
    for (int64_t c = 0; c < wc; ++c) acc[c] += row[c];
  };
  internal::TableCumulation<T>(d, width, width, query_mask, query_codes, key_mask, key_codes, out,
                               scatter, gather, pf);
}

// Weighted LSH cumulation: LshCumulationCpu with pair (i, j) weighted by
// <query_weight[b,i], key_weight[b,j]> (the building block of the eq. 4 backward).
// Buckets hold outer products key_weight (x) value: table [2^tau, W, Dc], so
// time is O(B m (Nq + Nk) W D) with no O(N^2) term.
template <typename T, typename ParallelFor>
void WeightedLshCumulationCpu(const CumulationDims& d, const float* query_mask,
                              const int32_t* query_codes, const T* query_weight,
                              const float* key_mask, const int32_t* key_codes,
                              const T* key_weight, const T* value, T* out, ParallelFor&& pf) {
  const int64_t wd = d.weight_dim;
  int64_t width = std::min<int64_t>(d.value_dim, 32);
  width = std::max<int64_t>(1, std::min(width, kCpuTableFloats / (d.num_buckets * std::max<int64_t>(wd, 1))));
  auto scatter = [&](float* row, int64_t b, int64_t j, int64_t c0, int64_t wc) {
    const T* v = value + (b * d.num_keys + j) * d.value_dim + c0;
    const T* kw = key_weight + (b * d.num_keys + j) * wd;
    float vf[64];
    for (int64_t c = 0; c < wc; ++c) vf[c] = static_cast<float>(v[c]);
    for (int64_t w = 0; w < wd; ++w) {
      const float k = static_cast<float>(kw[w]);
      float* r = row + w * wc;
      for (int64_t c = 0; c < wc; ++c) r[c] += k * vf[c];
    }
  };
  auto gather = [&](float* acc, const float* row, int64_t b, int64_t i, int64_t wc) {
    const T* qw = query_weight + (b * d.num_queries + i) * wd;
    for (int64_t w = 0; w < wd; ++w) {
      const float q = static_cast<float>(qw[w]);
      const float* r = row + w * wc;
      for (int64_t c = 0; c < wc; ++c) acc[c] += q * r[c];
    }
  };
  internal::TableCumulation<T>(d, wd * width, width, query_mask, query_codes, key_mask, key_codes,
                               out, scatter, gather, pf);
}

// First phase of the collision estimator: for each (b, h), the keys sorted by
// (code, index). sorted_codes / sorted_index are [B, m, Nk].
template <typename ParallelFor>
void SortKeysByCodeCpu(const CumulationDims& d, const int32_t* key_codes, int32_t* sorted_codes,
                       int32_t* sorted_index, ParallelFor&& pf) {
  pf(d.batch * d.num_hashes, d.num_keys * 20 + 1, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<int32_t, int32_t>> keyed(d.num_keys);
    for (int64_t row = begin; row < end; ++row) {
      const int32_t* kc = key_codes + row * d.num_keys;
      for (int64_t j = 0; j < d.num_keys; ++j) keyed[j] = {kc[j], static_cast<int32_t>(j)};
      std::sort(keyed.begin(), keyed.end());
      for (int64_t j = 0; j < d.num_keys; ++j) {
        sorted_codes[row * d.num_keys + j] = keyed[j].first;
        sorted_index[row * d.num_keys + j] = keyed[j].second;
      }
    }
  });
}

// Second phase of the collision estimator (*YOSO, appendix eq. 2 restricted to
// colliding pairs): for each query, walk the keys of its bucket in every hash,
// and for each pair that collides (counted once, at its first colliding hash)
// add <query_weight_i, key_weight_j> * CollisionDerivative(<query_i, key_j>) * key_j.
// query [B, Nq, d], query_weight [B, Nq, D], key [B, Nk, d], key_weight [B, Nk, D]
// -> out [B, Nq, d]. Time O(nnz (m + d + D)) plus O(Nq m log Nk) for the lookups.
template <typename T, typename ParallelFor>
void CollisionCumulationCpu(const CumulationDims& d, int hash_code_len, float epsilon,
                            const float* query_mask, const int32_t* query_codes, const T* query,
                            const T* query_weight, const float* key_mask,
                            const int32_t* key_codes, const T* key, const T* key_weight,
                            const int32_t* sorted_codes, const int32_t* sorted_index, T* out,
                            ParallelFor&& pf) {
  const int64_t dv = d.vector_dim, dw = d.value_dim;
  const int64_t expected_pairs = std::max<int64_t>(1, d.num_keys * d.num_hashes / std::max<int64_t>(1, d.num_buckets));
  pf(d.batch * d.num_queries, expected_pairs * (dv + dw + d.num_hashes) + d.num_hashes * 20 + 1,
     [&](int64_t begin, int64_t end) {
       std::vector<float> acc(dv), qv(dv), qwv(dw);
       for (int64_t row = begin; row < end; ++row) {
         const int64_t b = row / d.num_queries, i = row % d.num_queries;
         std::fill(acc.begin(), acc.end(), 0.0f);
         if (query_mask[row] != 0.0f) {
           for (int64_t c = 0; c < dv; ++c) qv[c] = static_cast<float>(query[row * dv + c]);
           for (int64_t c = 0; c < dw; ++c) qwv[c] = static_cast<float>(query_weight[row * dw + c]);
           const int32_t* qc = query_codes + b * d.num_hashes * d.num_queries + i;
           for (int64_t h = 0; h < d.num_hashes; ++h) {
             const int32_t code = qc[h * d.num_queries];
             if (!internal::ValidCode(code, d.num_buckets)) continue;
             const int32_t* codes_row = sorted_codes + (b * d.num_hashes + h) * d.num_keys;
             const int32_t* index_row = sorted_index + (b * d.num_hashes + h) * d.num_keys;
             const int32_t* first = std::lower_bound(codes_row, codes_row + d.num_keys, code);
             for (const int32_t* p = first; p != codes_row + d.num_keys && *p == code; ++p) {
               const int64_t j = index_row[p - codes_row];
               if (key_mask[b * d.num_keys + j] == 0.0f) continue;
               const int32_t* kc = key_codes + b * d.num_hashes * d.num_keys + j;
               if (!IsFirstCollision(qc, d.num_queries, kc, d.num_keys, h)) continue;
               const T* kv = key + (b * d.num_keys + j) * dv;
               const T* kw = key_weight + (b * d.num_keys + j) * dw;
               float x = 0.0f, g = 0.0f;
               for (int64_t c = 0; c < dv; ++c) x += qv[c] * static_cast<float>(kv[c]);
               for (int64_t c = 0; c < dw; ++c) g += qwv[c] * static_cast<float>(kw[c]);
               const float w = g * CollisionDerivative(x, hash_code_len, epsilon);
               for (int64_t c = 0; c < dv; ++c) acc[c] += w * static_cast<float>(kv[c]);
             }
           }
         }
         for (int64_t c = 0; c < dv; ++c) out[row * dv + c] = static_cast<T>(acc[c]);
       }
     });
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_YOSO_CPU_H_
