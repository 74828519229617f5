// The weighted LSH cumulation on the CPU (the blocks of the eq. 4 lower-bound backward).
#ifndef KERAS_YOSO_KERNELS_WEIGHTED_CPU_H_
#define KERAS_YOSO_KERNELS_WEIGHTED_CPU_H_

#include "causal_cpu.h"
#include "cpu_tiles.h"

namespace keras_yoso {

namespace internal {

// acc [Nq, Dp] += the hashes [h0, h1) of batch row b of WeightedLshCumulationCpu
// (unscaled). Float only, so it can be compiled for several x86-64 levels
// (KY_CPU_CLONES) and picked at load time.
KY_CPU_CLONES inline void WeightedCumulationHashes(
    const CumulationDims& d, int64_t b, int64_t h0, int64_t h1, const float* query_mask,
    const int32_t* query_codes, const float* query_weight, const float* key_mask,
    const int32_t* key_codes, const float* key_weight, const float* value, float* acc,
    WeightedScratch* s) {
  const int64_t w = d.weight_dim, dim = d.value_dim, padded = RoundUp(dim, kLanes);
  // Value rows are read in place when they are whole register tiles, else copied padded.
  const bool copy_values = padded != dim;
  PrepareWeightedScratch(d, w, padded, copy_values, s);
  float* table = s->table.data();
  const float** query_rows = s->query_rows.data();
  float** acc_rows = s->acc_rows.data();
  const float* const* value_rows = s->value_rows.data();
  const float* const* key_weight_rows = s->key_weight_rows.data();
  float* const* table_rows = s->table_rows.data();

  const float* qm = query_mask + b * d.num_queries;
  const float* km = key_mask + b * d.num_keys;
  const float* qw = query_weight + b * d.num_queries * w;
  const float* kw = key_weight + b * d.num_keys * w;
  const float* v = value + b * d.num_keys * dim;
  for (int64_t h = h0; h < h1; ++h) {
    const int32_t* qc = query_codes + (b * d.num_hashes + h) * d.num_queries;
    const int32_t* kc = key_codes + (b * d.num_hashes + h) * d.num_keys;
    SharedBuckets bucket = SortBuckets(qc, qm, d.num_queries, kc, km, d.num_keys, d.num_buckets, false, s);
    while (bucket.Next()) {
      // One bucket: queries[qa, qb) and keys[ka, kb).
      const int64_t nq = bucket.qb - bucket.qa;
      for (int64_t r = 0; r < nq; ++r) {
        query_rows[r] = qw + bucket.queries[bucket.qa + r] * w;
        acc_rows[r] = acc + bucket.queries[bucket.qa + r] * padded;
      }
      const bool use_table = TableIsCheaper(nq, bucket.kb - bucket.ka, w, padded);
      if (use_table) {
        std::fill_n(table, w * padded, 0.0f);
      } else if (static_cast<int64_t>(s->pair_rows.size()) < nq) {
        s->pair_weights.resize(nq * kKeyChunk);
        s->pair_rows.resize(nq);
        for (int64_t r = 0; r < nq; ++r) {
          s->pair_rows[r] = s->pair_weights.data() + r * kKeyChunk;
        }
      }
      for (int64_t k0 = bucket.ka; k0 < bucket.kb; k0 += kKeyChunk) {
        const int64_t chunk = std::min(kKeyChunk, bucket.kb - k0);
        LoadKeyChunk(k0, chunk, kw, v, w, dim, padded, copy_values, s);
        if (use_table) {
          // table += K_chunk^T V_chunk
          MultiplyAccumulate(table_rows, key_weight_rows, w, chunk, value_rows, padded);
          continue;
        }
        // pair_weights = Q K_chunk^T, then acc += pair_weights V_chunk.
        float* const* pair_rows = s->pair_rows.data();
        std::fill_n(s->pair_weights.data(), nq * kKeyChunk, 0.0f);
        MultiplyAccumulate(pair_rows, query_rows, nq, w, key_weight_rows, RoundUp(chunk, kLanes));
        MultiplyAccumulate(acc_rows, pair_rows, nq, chunk, value_rows, padded);
      }
      if (use_table) {
        // acc += Q table
        MultiplyAccumulate(acc_rows, query_rows, nq, w, table_rows, padded);
      }
    }
  }
}

}  // namespace internal

// Weighted LSH cumulation: LshCumulationCpu with pair (i, j) weighted by
// <query_weight[b,i], key_weight[b,j]> (the building block of the eq. 4 backward):
// out[b,i] = qmask[b,i] / m * sum_h sum_j kmask[b,j] [qc[b,h,i] == kc[b,h,j]]
//            <query_weight[b,i], key_weight[b,j]> value[b,j],
// over keys j <= i when causal = 1 and j >= i when causal = -1 (then Nq == Nk).
// query_weight [B, Nq, W], key_weight [B, Nk, W], value [B, Nk, D] -> out [B, Nq, D].
//
// Per hash, the unmasked queries and keys are sorted by code (radix sort), and
// each bucket with queries Q and keys K adds Q K^T V to its queries' rows,
// either pair by pair, (Q K^T) V at nq nk (W + D) multiply-adds, or through the
// bucket's table, Q (K^T V) at (nq + nk) W D, whichever costs less. Time
// O(B m sum_buckets min(nq nk (W + D), (nq + nk) W D)), at most O(B m (Nq + Nk) W D)
// and O(B m Nq Nk (W + D) / 2^tau) for uniformly spread codes; memory O(B Nq D).
// Work unit (b, g) sums hash group g (kHashGroups contiguous groups) for all queries
// of row b; the groups' sums are then added in group order. The split depends
// on m only, so every element is summed in the same order whatever the thread count.
// Causal: the same units, with CausalWeightedCumulationHashes per hash group (a
// running [W, D] state or pairs per bucket, in walk order).
template <typename T, typename ParallelFor>
void WeightedLshCumulationCpu(const CumulationDims& d, int64_t causal, const float* query_mask,
                              const int32_t* query_codes, const T* query_weight,
                              const float* key_mask, const int32_t* key_codes,
                              const T* key_weight, const T* value, T* out, ParallelFor&& pf) {
  std::vector<float> qw_f, kw_f, v_f;
  const int64_t query_floats = d.batch * d.num_queries * d.weight_dim;
  const float* qw = internal::AsFloat(query_weight, query_floats, &qw_f, pf);
  const float* kw = internal::AsFloat(key_weight, d.batch * d.num_keys * d.weight_dim, &kw_f, pf);
  const float* v = internal::AsFloat(value, d.batch * d.num_keys * d.value_dim, &v_f, pf);
  const int64_t groups = std::min(internal::kHashGroups, d.num_hashes);
  const int64_t padded = internal::RoundUp(d.value_dim, internal::kLanes);
  const int64_t rows = d.batch * d.num_queries;
  // sums[g] [B, Nq, Dp]: hash group g's sum (each unit zeroes its own part).
  std::unique_ptr<float[]> sums(new float[groups * rows * padded]);
  // About 16 colliding pairs per position and hash, (W + D) multiply-adds each.
  const double unit_cost = 16.0 * static_cast<double>(d.num_hashes) / static_cast<double>(groups) *
                           static_cast<double>(d.num_queries + d.num_keys) *
                           static_cast<double>(d.weight_dim + padded);
  pf(d.batch * groups, internal::CostPerUnit(unit_cost), [&](int64_t begin, int64_t end) {
    internal::WeightedScratch scratch;
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / groups, g = unit % groups;
      float* acc = sums.get() + (g * d.batch + b) * d.num_queries * padded;
      std::fill_n(acc, d.num_queries * padded, 0.0f);
      const int64_t h0 = g * d.num_hashes / groups, h1 = (g + 1) * d.num_hashes / groups;
      if (causal == 0) {
        internal::WeightedCumulationHashes(d, b, h0, h1, query_mask, query_codes, qw, key_mask,
                                           key_codes, kw, v, acc, &scratch);
      } else {
        internal::CausalWeightedCumulationHashes(d, causal, b, h0, h1, query_mask, query_codes,
                                                 qw, key_mask, key_codes, kw, v, acc, &scratch);
      }
    }
  });
  const float scale = 1.0f / static_cast<float>(d.num_hashes);
  pf(rows, groups * d.value_dim + 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float s = query_mask[row] != 0.0f ? scale : 0.0f;
      for (int64_t c = 0; c < d.value_dim; ++c) {
        float total = sums[row * padded + c];
        for (int64_t g = 1; g < groups; ++g) total += sums[(g * rows + row) * padded + c];
        out[row * d.value_dim + c] = static_cast<T>(total * s);
      }
    }
  });
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_WEIGHTED_CPU_H_
