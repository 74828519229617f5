// The *YOSO collision estimator on the CPU (appendix eq. 2 on colliding pairs).
#ifndef KERAS_YOSO_KERNELS_COLLISION_CPU_H_
#define KERAS_YOSO_KERNELS_COLLISION_CPU_H_

#include "cpu_tiles.h"

namespace keras_yoso {
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
  const int64_t dv = d.vector_dim, dw = d.weight_dim;
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
             if (!ValidCode(code, d.num_buckets)) continue;
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

#endif  // KERAS_YOSO_KERNELS_COLLISION_CPU_H_
