// The LSH cumulation of YOSO eq. 2 on the CPU, bidirectional and causal, and its decoding step.
#ifndef KERAS_YOSO_KERNELS_LSH_CPU_H_
#define KERAS_YOSO_KERNELS_LSH_CPU_H_

#include "causal_cpu.h"
#include "cpu_tiles.h"

namespace keras_yoso {

namespace internal {

// acc [Nq, wc] = the unscaled LshCumulationCpu sum of batch row b, value columns
// [c0, c0 + wc): per hash, keys are added into their bucket's row of table
// [num_buckets, wc] (all zero on entry and on return), queries read their
// bucket's row, and the rows keys touched are zeroed (O(Nk), not O(num_buckets)).
KY_CPU_CLONES inline void LshCumulationColumns(const CumulationDims& d, int64_t b, int64_t c0,
                                               int64_t wc, const float* query_mask,
                                               const int32_t* query_codes, const float* key_mask,
                                               const int32_t* key_codes, const float* value,
                                               float* table, float* acc) {
  std::fill_n(acc, d.num_queries * wc, 0.0f);
  const float* qm = query_mask + b * d.num_queries;
  const float* km = key_mask + b * d.num_keys;
  const float* v = value + b * d.num_keys * d.value_dim + c0;
  for (int64_t h = 0; h < d.num_hashes; ++h) {
    const int32_t* qc = query_codes + (b * d.num_hashes + h) * d.num_queries;
    const int32_t* kc = key_codes + (b * d.num_hashes + h) * d.num_keys;
    for (int64_t j = 0; j < d.num_keys; ++j) {
      if (km[j] == 0.0f || !ValidCode(kc[j], d.num_buckets)) continue;
      float* row = table + kc[j] * wc;
      const float* vj = v + j * d.value_dim;
      for (int64_t c = 0; c < wc; ++c) row[c] += vj[c];
    }
    for (int64_t i = 0; i < d.num_queries; ++i) {
      if (qm[i] == 0.0f || !ValidCode(qc[i], d.num_buckets)) continue;
      const float* row = table + qc[i] * wc;
      float* ai = acc + i * wc;
      for (int64_t c = 0; c < wc; ++c) ai[c] += row[c];
    }
    for (int64_t j = 0; j < d.num_keys; ++j) {
      if (km[j] == 0.0f || !ValidCode(kc[j], d.num_buckets)) continue;
      std::fill_n(table + kc[j] * wc, wc, 0.0f);
    }
  }
}

}  // namespace internal

// LSH cumulation, YOSO eq. 2 averaged over m hashes (paper §3.2, Figure 3):
// out[b,i] = qmask[b,i] / m * sum_h sum_j kmask[b,j] [qc[b,h,i] == kc[b,h,j]] value[b,j],
// over keys j <= i when causal = 1 and j >= i when causal = -1 (then Nq == Nk).
// query_codes [B, m, Nq], key_codes [B, m, Nk], masks [B, N], value [B, Nk, D] -> out [B, Nq, D].
// Time O(B m (Nq + Nk) D); memory one [2^tau, <=64] float table per worker (causal: a
// running sum of <= 64 floats per bucket that has keys, and a 2^tau int map from code to
// sum, see CausalLshCumulationColumns).
// Work unit (b, value column block) owns its output elements.
template <typename T, typename ParallelFor>
void LshCumulationCpu(const CumulationDims& d, int64_t causal, const float* query_mask,
                      const int32_t* query_codes, const float* key_mask,
                      const int32_t* key_codes, const T* value, T* out, ParallelFor&& pf) {
  std::vector<float> v_f;
  const float* v = internal::AsFloat(value, d.batch * d.num_keys * d.value_dim, &v_f, pf);
  const int64_t width = causal == 0
                            ? internal::ValueColumnBlock(d.num_buckets, d.value_dim, 1)
                            : std::max<int64_t>(1, std::min(d.value_dim, internal::kCausalColumns));
  const int64_t blocks = (d.value_dim + width - 1) / width;
  const double unit_cost = static_cast<double>(d.num_hashes) *
                           static_cast<double>(d.num_queries + 2 * d.num_keys) *
                           static_cast<double>(width);
  pf(d.batch * blocks, internal::CostPerUnit(unit_cost), [&](int64_t begin, int64_t end) {
    std::vector<float> table(causal == 0 ? d.num_buckets * width : 0, 0.0f);
    std::vector<float> acc(d.num_queries * width);
    internal::CausalLshScratch scratch;
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / blocks, c0 = (unit % blocks) * width;
      const int64_t wc = std::min(width, d.value_dim - c0);
      if (causal == 0) {
        internal::LshCumulationColumns(d, b, c0, wc, query_mask, query_codes, key_mask,
                                       key_codes, v, table.data(), acc.data());
      } else {
        internal::CausalLshCumulationColumns(d, causal, b, c0, wc, query_mask, query_codes,
                                             key_mask, key_codes, v, &scratch, acc.data());
      }
      const float scale = 1.0f / static_cast<float>(d.num_hashes);
      for (int64_t i = 0; i < d.num_queries; ++i) {
        T* o = out + (b * d.num_queries + i) * d.value_dim + c0;
        const float s = query_mask[b * d.num_queries + i] != 0.0f ? scale : 0.0f;
        for (int64_t c = 0; c < wc; ++c) o[c] = static_cast<T>(acc[i * wc + c] * s);
      }
    }
  });
}

// Decoding step of causal YOSO (eq. 2 as linear attention with one-hot features): T new
// positions over the bucket tables of the earlier ones. Per (b, h), in position order t:
// key t's value joins bucket kc[b,h,t] (when kept), then query t reads bucket qc[b,h,t], so
// it sees the earlier positions and the new keys j <= t:
//   out[b,t] = qmask[b,t] / m * sum_h tables_out_t[b,h,qc[b,h,t]],
//   tables_out[b,h] = tables[b,h] + sum_{t kept} e_{kc[b,h,t]} value[b,t].
// tables, tables_out [B, m, num_buckets, D] float32 (tables_out may be tables: updated in place);
// value [B, T, D] -> out [B, T, D]. Codes already checked to lie in [0, num_buckets).
// Work unit b owns its rows of out and tables_out; every element is summed in position order,
// then over hashes in order, whatever the thread count.
template <typename T, typename ParallelFor>
void LshCumulationStepCpu(const CumulationDims& d, const float* query_mask, const int32_t* query_codes,
                          const float* key_mask, const int32_t* key_codes, const T* value,
                          const float* tables, T* out, float* tables_out, ParallelFor&& pf) {
  const int64_t length = d.num_queries, width = d.value_dim, table = d.num_buckets * width;
  const double unit_cost = static_cast<double>(d.num_hashes) *
                           static_cast<double>((tables == tables_out ? 0 : table) + 2 * length * width);
  pf(d.batch, internal::CostPerUnit(unit_cost), [&](int64_t begin, int64_t end) {
    std::vector<float> acc(length * width), v(length * width);
    for (int64_t b = begin; b < end; ++b) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t i = 0; i < length * width; ++i) v[i] = static_cast<float>(value[b * length * width + i]);
      for (int64_t h = 0; h < d.num_hashes; ++h) {
        const int64_t row = b * d.num_hashes + h;
        float* tab = tables_out + row * table;
        if (tables != tables_out) std::copy(tables + row * table, tables + (row + 1) * table, tab);
        const int32_t* qc = query_codes + row * length;
        const int32_t* kc = key_codes + row * length;
        for (int64_t t = 0; t < length; ++t) {
          if (key_mask[b * length + t] != 0.0f) {
            float* bucket = tab + static_cast<int64_t>(kc[t]) * width;
            for (int64_t c = 0; c < width; ++c) bucket[c] += v[t * width + c];
          }
          if (query_mask[b * length + t] != 0.0f) {
            const float* bucket = tab + static_cast<int64_t>(qc[t]) * width;
            for (int64_t c = 0; c < width; ++c) acc[t * width + c] += bucket[c];
          }
        }
      }
      const float scale = 1.0f / static_cast<float>(d.num_hashes);
      for (int64_t t = 0; t < length; ++t) {
        const float s = query_mask[b * length + t] != 0.0f ? scale : 0.0f;
        T* o = out + (b * length + t) * width;
        for (int64_t c = 0; c < width; ++c) o[c] = static_cast<T>(acc[t * width + c] * s);
      }
    }
  });
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_LSH_CPU_H_
