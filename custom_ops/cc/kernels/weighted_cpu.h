// The weighted LSH cumulation on the CPU and the eq. 4 lower-bound backward built on its walk.
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

  const float* qw = query_weight + b * d.num_queries * w;
  const float* kw = key_weight + b * d.num_keys * w;
  const float* v = value + b * d.num_keys * dim;
  for (int64_t h = h0; h < h1; ++h) {
    SharedBuckets bucket = SortBuckets(d, b, h, query_mask, query_codes, key_mask, key_codes, false, s);
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

// The lower-bound backward's dims (value_dim = W, vector_dim = d) as the weighted walk reads them:
// weights of width W (dY and V) and values of width d (K and Q).
inline CumulationDims AsWeightedWalk(const CumulationDims& lower_bound_dims) {
  CumulationDims walk = lower_bound_dims;
  walk.weight_dim = lower_bound_dims.value_dim;
  walk.value_dim = lower_bound_dims.vector_dim;
  walk.vector_dim = 0;
  return walk;
}

// Working memory of one LowerBoundGradientsCpu worker beyond the weighted walk's: the dK side.
struct LowerBoundScratch {
  WeightedScratch walk;                       // sort, key chunks, pair weights, table V^T K
  std::vector<float> transposed_pairs;        // [kKeyChunk, nq]: a chunk's pair weights, transposed
  std::vector<const float*> transposed_rows;  // its rows
  std::vector<float*> key_acc_rows;           // [Nk]: the dK rows of a bucket's keys
  std::vector<const float*> value_rows;       // [Nk]: the value rows of a bucket's keys
  std::vector<const float*> query_rows;       // [Nq]: the (padded) query rows of a bucket's queries
  std::vector<float> gradient_chunk;          // [Dv, kKeyChunk]: dY rows of a query chunk, transposed
  std::vector<const float*> gradient_chunk_rows;
  std::vector<float> query_table;             // [Dv, Dp]: dY^T Q of a bucket
  std::vector<float*> query_table_rows;
};

// True when a bucket (nq queries, nk keys) costs fewer multiply-adds through its two tables
// (V^T K for dQ, dY^T Q for dK) than pair by pair (pair weights kLanes keys at a time, each
// applied to both sides).
inline bool FusedTableIsCheaper(int64_t nq, int64_t nk, int64_t value_dim, int64_t padded_dim) {
  return 2 * (nq + nk) * value_dim * padded_dim <
         nq * RoundUp(nk, kLanes) * value_dim + 2 * nq * nk * padded_dim;
}

// dq_acc [Nq, Dp] and dk_acc [Nk, Dp] += the hashes [h0, h1) of batch row b of
// LowerBoundGradientsCpu (unscaled). query and key are rows of Dp floats (padded), dy rows of
// W = d.weight_dim floats (the value width), value rows of W floats.
KY_CPU_CLONES inline void LowerBoundGradientHashes(
    const CumulationDims& d, int64_t b, int64_t h0, int64_t h1, const float* query_mask,
    const int32_t* query_codes, const float* query, const float* output_gradient, const float* key_mask,
    const int32_t* key_codes, const float* key, const float* value, float* dq_acc, float* dk_acc,
    LowerBoundScratch* s) {
  const int64_t w = d.weight_dim, padded = RoundUp(d.value_dim, kLanes);
  WeightedScratch* walk = &s->walk;
  PrepareWeightedScratch(d, w, padded, false, walk);
  s->transposed_rows.resize(kKeyChunk);
  s->key_acc_rows.resize(d.num_keys);
  s->value_rows.resize(d.num_keys);
  s->query_rows.resize(d.num_queries);
  s->gradient_chunk.assign(w * kKeyChunk, 0.0f);
  s->gradient_chunk_rows.resize(w);
  s->query_table.resize(w * padded);
  s->query_table_rows.resize(w);
  for (int64_t k = 0; k < w; ++k) {
    s->gradient_chunk_rows[k] = s->gradient_chunk.data() + k * kKeyChunk;
    s->query_table_rows[k] = s->query_table.data() + k * padded;
  }
  float* key_table = walk->table.data();
  const float** gradient_rows = walk->query_rows.data();
  float** dq_rows = walk->acc_rows.data();
  const float** query_rows = s->query_rows.data();
  float** dk_rows = s->key_acc_rows.data();
  const float** value_rows = s->value_rows.data();

  const float* q = query + b * d.num_queries * padded;
  const float* dy = output_gradient + b * d.num_queries * w;
  const float* k = key + b * d.num_keys * padded;
  const float* v = value + b * d.num_keys * w;
  for (int64_t h = h0; h < h1; ++h) {
    SharedBuckets bucket = SortBuckets(d, b, h, query_mask, query_codes, key_mask, key_codes, false, walk);
    while (bucket.Next()) {
      // One bucket: queries [qa, qb) and keys [ka, kb) of the sorted lists.
      const int64_t nq = bucket.qb - bucket.qa, nk = bucket.kb - bucket.ka;
      for (int64_t r = 0; r < nq; ++r) {
        const int64_t i = bucket.queries[bucket.qa + r];
        gradient_rows[r] = dy + i * w;
        dq_rows[r] = dq_acc + i * padded;
        query_rows[r] = q + i * padded;
      }
      for (int64_t r = 0; r < nk; ++r) {
        const int64_t j = bucket.keys[bucket.ka + r];
        dk_rows[r] = dk_acc + j * padded;
        value_rows[r] = v + j * w;
      }
      if (FusedTableIsCheaper(nq, nk, w, padded)) {
        // dQ += dY (V^T K) and dK += V (dY^T Q): each side through its [W, Dp] table.
        std::fill_n(key_table, w * padded, 0.0f);
        for (int64_t k0 = bucket.ka; k0 < bucket.kb; k0 += kKeyChunk) {
          const int64_t chunk = std::min(kKeyChunk, bucket.kb - k0);
          LoadKeyChunk(k0, chunk, v, k, w, padded, padded, false, walk);
          MultiplyAccumulate(walk->table_rows.data(), walk->key_weight_rows.data(), w, chunk,
                             walk->value_rows.data(), padded);
        }
        MultiplyAccumulate(dq_rows, gradient_rows, nq, w, walk->table_rows.data(), padded);
        std::fill_n(s->query_table.data(), w * padded, 0.0f);
        for (int64_t r0 = 0; r0 < nq; r0 += kKeyChunk) {
          const int64_t chunk = std::min(kKeyChunk, nq - r0);
          TransposeRows(gradient_rows + r0, chunk, w, s->gradient_chunk.data(), kKeyChunk);
          MultiplyAccumulate(s->query_table_rows.data(), s->gradient_chunk_rows.data(), w, chunk,
                             query_rows + r0, padded);
        }
        MultiplyAccumulate(dk_rows, value_rows, nk, w, s->query_table_rows.data(), padded);
        continue;
      }
      // Pair by pair, kKeyChunk keys at a time: P = dY V_chunk^T once, then dQ += P K_chunk and
      // dK_chunk += P^T Q.
      if (static_cast<int64_t>(walk->pair_rows.size()) < nq) {
        walk->pair_weights.resize(nq * kKeyChunk);
        walk->pair_rows.resize(nq);
        for (int64_t r = 0; r < nq; ++r) walk->pair_rows[r] = walk->pair_weights.data() + r * kKeyChunk;
      }
      if (static_cast<int64_t>(s->transposed_pairs.size()) < kKeyChunk * nq) {
        s->transposed_pairs.resize(kKeyChunk * nq);
      }
      for (int64_t c = 0; c < kKeyChunk; ++c) s->transposed_rows[c] = s->transposed_pairs.data() + c * nq;
      float* const* pair_rows = walk->pair_rows.data();
      for (int64_t k0 = bucket.ka; k0 < bucket.kb; k0 += kKeyChunk) {
        const int64_t chunk = std::min(kKeyChunk, bucket.kb - k0);
        LoadKeyChunk(k0, chunk, v, k, w, padded, padded, false, walk);
        std::fill_n(walk->pair_weights.data(), nq * kKeyChunk, 0.0f);
        MultiplyAccumulate(pair_rows, gradient_rows, nq, w, walk->key_weight_rows.data(), RoundUp(chunk, kLanes));
        MultiplyAccumulate(dq_rows, pair_rows, nq, chunk, walk->value_rows.data(), padded);
        TransposeRows(pair_rows, nq, chunk, s->transposed_pairs.data(), nq);
        MultiplyAccumulate(dk_rows + (k0 - bucket.ka), s->transposed_rows.data(), chunk, nq, query_rows,
                           padded);
      }
    }
  }
}

// x [rows, dim] as rows of `padded` floats: x itself when padded == dim, else a zero-padded copy
// in *buffer.
template <typename ParallelFor>
const float* PaddedRows(const float* x, int64_t rows, int64_t dim, int64_t padded, std::vector<float>* buffer,
                        ParallelFor&& pf) {
  if (padded == dim) return x;
  buffer->assign(rows * padded, 0.0f);
  float* y = buffer->data();
  pf(rows, dim + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) std::copy(x + r * dim, x + (r + 1) * dim, y + r * padded);
  });
  return y;
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

// The two gradients of the eq. 4 lower bound in one pass (each pair's weight computed once): with
// s_ij = kmask_j [qc[b,h,i] == kc[b,h,j]] <output_gradient[b,i], value[b,j]>,
//   query_gradient[b,i] = qmask[b,i] / m * sum_h sum_j s_ij key[b,j],
//   key_gradient[b,j]   = kmask[b,j] / m * sum_h sum_i qmask_i s_ij query[b,i]
// (unscaled: the caller multiplies by tau / 2). Equal to two weighted cumulations,
// WeightedLshCumulationCpu(qm, qc, dY, km, kc, V, K) and (km, kc, V, qm, qc, dY, Q), which is how
// causal = 1 is computed (dQ_i over keys j <= i, dK_j over queries i >= j; Nq == Nk).
// query [B, Nq, d], key [B, Nk, d], value [B, Nk, W], output_gradient [B, Nq, W] -> query_gradient
// [B, Nq, d], key_gradient [B, Nk, d]; dims as CheckLowerBoundGradients fills them (value_dim = W,
// vector_dim = d), walked as a weighted cumulation whose weights are dY and V (width W) and whose
// values are K and Q (width d): AsWeightedWalk.
// Per hash the kept queries and keys are sorted by code once, and each bucket either computes
// P = dY V^T (nq nk W multiply-adds) and applies it to both sides (2 nq nk d), or goes through
// the tables V^T K and dY^T Q (2 (nq + nk) W d), whichever costs less: a quarter fewer
// multiply-adds and half the sorting of the two weighted cumulations on the pair path.
// Work units and the fixed-order sum over hash groups as in WeightedLshCumulationCpu.
template <typename T, typename ParallelFor>
void LowerBoundGradientsCpu(const CumulationDims& lower_bound_dims, int64_t causal, const float* query_mask,
                            const int32_t* query_codes, const T* query, const float* key_mask,
                            const int32_t* key_codes, const T* key, const T* value, const T* output_gradient,
                            T* query_gradient, T* key_gradient, ParallelFor&& pf) {
  const CumulationDims d = internal::AsWeightedWalk(lower_bound_dims);
  if (causal != 0) {
    CumulationDims keys_first = d;
    std::swap(keys_first.num_queries, keys_first.num_keys);
    WeightedLshCumulationCpu<T>(d, causal, query_mask, query_codes, output_gradient, key_mask, key_codes, value,
                                key, query_gradient, pf);
    WeightedLshCumulationCpu<T>(keys_first, -causal, key_mask, key_codes, value, query_mask, query_codes,
                                output_gradient, query, key_gradient, pf);
    return;
  }
  const int64_t dim = d.value_dim, w = d.weight_dim, padded = internal::RoundUp(dim, internal::kLanes);
  std::vector<float> q_f, k_f, v_f, dy_f, q_p, k_p;
  const int64_t query_rows = d.batch * d.num_queries, key_rows = d.batch * d.num_keys;
  const float* q = internal::PaddedRows(internal::AsFloat(query, query_rows * dim, &q_f, pf), query_rows, dim,
                                        padded, &q_p, pf);
  const float* k = internal::PaddedRows(internal::AsFloat(key, key_rows * dim, &k_f, pf), key_rows, dim, padded,
                                        &k_p, pf);
  const float* v = internal::AsFloat(value, key_rows * w, &v_f, pf);
  const float* dy = internal::AsFloat(output_gradient, query_rows * w, &dy_f, pf);
  const int64_t groups = std::min(internal::kHashGroups, d.num_hashes);
  // sums of hash group g: dQ [B, Nq, Dp] at g * (query_rows + key_rows) * Dp, then dK [B, Nk, Dp].
  const int64_t group_floats = (query_rows + key_rows) * padded;
  std::unique_ptr<float[]> sums(new float[groups * group_floats]);
  // About 16 colliding pairs per position and hash, (W + 2 d) multiply-adds each.
  const double unit_cost = 16.0 * static_cast<double>(d.num_hashes) / static_cast<double>(groups) *
                           static_cast<double>(d.num_queries + d.num_keys) * static_cast<double>(w + 2 * padded);
  pf(d.batch * groups, internal::CostPerUnit(unit_cost), [&](int64_t begin, int64_t end) {
    internal::LowerBoundScratch scratch;
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / groups, g = unit % groups;
      float* dq_acc = sums.get() + g * group_floats + b * d.num_queries * padded;
      float* dk_acc = sums.get() + g * group_floats + query_rows * padded + b * d.num_keys * padded;
      std::fill_n(dq_acc, d.num_queries * padded, 0.0f);
      std::fill_n(dk_acc, d.num_keys * padded, 0.0f);
      const int64_t h0 = g * d.num_hashes / groups, h1 = (g + 1) * d.num_hashes / groups;
      internal::LowerBoundGradientHashes(d, b, h0, h1, query_mask, query_codes, q, dy, key_mask, key_codes, k, v,
                                         dq_acc, dk_acc, &scratch);
    }
  });
  const float scale = 1.0f / static_cast<float>(d.num_hashes);
  pf(query_rows + key_rows, groups * dim + 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const bool is_query = row < query_rows;
      const float keep = is_query ? query_mask[row] : key_mask[row - query_rows];
      const float s = keep != 0.0f ? scale : 0.0f;
      T* out = is_query ? query_gradient + row * dim : key_gradient + (row - query_rows) * dim;
      for (int64_t c = 0; c < dim; ++c) {
        float total = sums[row * padded + c];
        for (int64_t g = 1; g < groups; ++g) total += sums[g * group_floats + row * padded + c];
        out[c] = static_cast<T>(total * s);
      }
    }
  });
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_WEIGHTED_CPU_H_
