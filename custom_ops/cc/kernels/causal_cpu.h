// The causal cumulations' inner loops on the CPU (a key counts for the queries at or after its
// position): LshCumulationCpu and WeightedLshCumulationCpu call them for causal != 0.
#ifndef KERAS_YOSO_KERNELS_CAUSAL_CPU_H_
#define KERAS_YOSO_KERNELS_CAUSAL_CPU_H_

#include "cpu_tiles.h"

namespace keras_yoso {

namespace internal {

// ---------------------------------------------------------------------------
// Causal cumulations (Zeng et al. 2021 eq. 2 / eq. 4, causal): key j counts for
// query i only when j <= i (causal = 1) or j >= i (causal = -1, the transposed
// cumulations of a causal backward). Queries and keys are the same positions
// (Nq == Nk). Masked keys never count, masked queries read nothing.
//
// Per (row b, hash h) a stable radix sort by code (SortPositionsByCode) lists
// each bucket's kept queries and keys in walk order: ascending positions for
// causal = 1, descending for causal = -1. Walking a bucket in that order, the
// keys query r may see are a prefix of the bucket's keys, counts[r] of them
// (the keys at or before its position: a position adds its key before its query
// reads, so j == i counts in both directions). A running state over that prefix
// serves every query:
//   eq. 2 (lsh): state = sum of the prefix's values [D]; out_i += state;
//   eq. 4 blocks (weighted): state = sum of kw_j (x) v_j [W, D]; out_i += qw_i^T state,
// and a small bucket is cheaper pair by pair, sum_{j in prefix} <qw_i, kw_j> v_j:
// about s^2/2 (W + D) multiply-adds for s positions against s W D for the state,
// so the weighted kernel picks the cheaper per bucket (CausalStateIsCheaper), as
// the bidirectional kernel picks between pairs and its K^T V table. The lsh state
// is small enough to keep one per bucket and walk all buckets at once, in position
// order (CausalLshCumulationColumns): the same sums, with values and outputs read
// in order. Memory per worker: O(Nq + Nk) for the sorts, O(2^tau) ints at most
// (the sort's digit counts; the lsh code -> state map), the weighted kernel's
// [W, D] state, the lsh states O(min(2^tau, Nk) D); no [2^tau, D] table.

// True when key position `key` comes at or before query position `query` in the
// walk order of direction `causal` (1: ascending positions, -1: descending).
KY_CPU_INLINE bool KeyBeforeQuery(int64_t key, int64_t query, int64_t causal) {
  return causal > 0 ? key <= query : key >= query;
}

// Working memory of one causal LshCumulationCpu worker.
struct CausalLshScratch {
  std::vector<int32_t> slot_of_code;  // [num_buckets]: a code's row of sums this hash, or -1
  std::vector<float> sums;            // [min(num_buckets, Nk), wc]: each bucket's running sum
};

// acc [Nq, wc] = the unscaled causal LshCumulationCpu sum of batch row b, value
// columns [c0, c0 + wc), wc <= kCausalColumns. The per-bucket walks of eq. 2 need
// only the running sum state [wc] of each bucket, so they are interleaved: one pass
// over the positions in walk order (ascending for causal = 1, descending for -1)
// adds each key's value to its bucket's sum, then the query at that position adds
// its bucket's sum. Each bucket's sum is thus built in its own walk order, as a
// sort by code followed by one walk per bucket would build it, with the same
// numbers, but values and outputs are read in position order. A bucket gets a row
// of `sums` at its first key (code -> row in slot_of_code, O(2^tau) ints, reset
// after each hash in O(Nk)), so the sums take O(min(2^tau, Nk) wc) floats. Time
// O(m (Nq + Nk) wc); every element summed in a fixed order (hash, then walk order).
KY_CPU_CLONES inline void CausalLshCumulationColumns(const CumulationDims& d, int64_t causal,
                                                     int64_t b, int64_t c0, int64_t wc,
                                                     const float* query_mask,
                                                     const int32_t* query_codes,
                                                     const float* key_mask,
                                                     const int32_t* key_codes, const float* value,
                                                     CausalLshScratch* s, float* acc) {
  std::fill_n(acc, d.num_queries * wc, 0.0f);
  if (static_cast<int64_t>(s->slot_of_code.size()) != d.num_buckets) {
    s->slot_of_code.assign(d.num_buckets, -1);
  }
  s->sums.resize(std::min(d.num_buckets, d.num_keys) * wc);
  int32_t* slot_of_code = s->slot_of_code.data();
  float* sums = s->sums.data();
  const int64_t n = d.num_keys;  // == d.num_queries
  const float* qm = query_mask + b * n;
  const float* km = key_mask + b * n;
  const float* v = value + b * n * d.value_dim + c0;
  for (int64_t h = 0; h < d.num_hashes; ++h) {
    const int32_t* qc = query_codes + (b * d.num_hashes + h) * n;
    const int32_t* kc = key_codes + (b * d.num_hashes + h) * n;
    int32_t rows = 0;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t p = causal > 0 ? t : n - 1 - t;
      if (km[p] != 0.0f && ValidCode(kc[p], d.num_buckets)) {
        int32_t& slot = slot_of_code[kc[p]];
        float* sum = sums + static_cast<int64_t>(slot < 0 ? rows : slot) * wc;
        const float* vp = v + p * d.value_dim;
        if (slot < 0) {
          slot = rows++;
          for (int64_t c = 0; c < wc; ++c) sum[c] = vp[c];
        } else {
          for (int64_t c = 0; c < wc; ++c) sum[c] += vp[c];
        }
      }
      if (qm[p] != 0.0f && ValidCode(qc[p], d.num_buckets)) {
        const int32_t slot = slot_of_code[qc[p]];
        if (slot < 0) continue;  // no key of its bucket yet
        const float* sum = sums + static_cast<int64_t>(slot) * wc;
        float* ap = acc + p * wc;
        for (int64_t c = 0; c < wc; ++c) ap[c] += sum[c];
      }
    }
    for (int64_t p = 0; p < n; ++p) {
      if (ValidCode(kc[p], d.num_buckets)) slot_of_code[kc[p]] = -1;
    }
  }
}

// True when a causal bucket whose queries see counts[0, nq) of its keys (nondecreasing)
// costs fewer multiply-adds with a running [W, D] state than pair by pair. Both walk the
// keys in chunks of kKeyChunk; pair by pair, query r takes its counts[r] pairs (W + D each);
// with the state, the chunks before a query's last chunk reach it through one read of the
// state (W D), only its last chunk pair by pair, and each chunk before the last needed one
// is added to the state (W D a key).
inline bool CausalStateIsCheaper(const int64_t* counts, int64_t nq, int64_t w, int64_t padded_dim) {
  const int64_t needed = counts[nq - 1];
  if (needed <= kKeyChunk) return false;  // one chunk: the state would stay empty
  int64_t pairs = 0, state_pairs = 0, reads = 0;
  for (int64_t r = 0; r < nq; ++r) {
    if (counts[r] == 0) continue;
    const int64_t last_chunk = (counts[r] - 1) / kKeyChunk * kKeyChunk;
    pairs += counts[r];
    state_pairs += counts[r] - last_chunk;
    reads += last_chunk > 0;
  }
  const int64_t updates = (needed - 1) / kKeyChunk * kKeyChunk;
  return (updates + reads) * w * padded_dim + state_pairs * (w + padded_dim) <
         pairs * (w + padded_dim);
}

// One tile of `rows` <= kCausalTile queries of a causal bucket, pair by pair over
// the current key chunk: acc_rows[t] += sum_{j < local[t]} <query_rows[t], kw_j> v_j,
// local nondecreasing. tile_rows = Q_tile K_chunk^T first (for each row's keys, in
// whole kLanes columns), then applied in segments, rows [t, rows) over keys
// [local[t-1], local[t]): each row sums its own keys in order and no others.
KY_CPU_INLINE void CausalPairTile(const float* const* query_rows, float* const* acc_rows,
                                  int64_t rows, const int64_t* local, int64_t w,
                                  const float* const* key_weight_rows,
                                  const float* const* value_rows, int64_t padded,
                                  float* const* tile_rows, const float** shifted) {
  const int64_t cols = RoundUp(local[rows - 1], kLanes);
  for (int64_t t = 0; t < rows; ++t) std::fill_n(tile_rows[t], cols, 0.0f);
  MultiplyAccumulate(tile_rows, query_rows, rows, w, key_weight_rows, cols);
  for (int64_t t = 0, j0 = 0; t < rows; ++t) {
    const int64_t j1 = local[t];
    if (j1 <= j0) continue;
    for (int64_t u = t; u < rows; ++u) shifted[u - t] = tile_rows[u] + j0;
    MultiplyAccumulate(acc_rows + t, shifted, rows - t, j1 - j0, value_rows + j0,
                             padded);
    j0 = j1;
  }
}

// acc [Nq, Dp] += the hashes [h0, h1) of batch row b of the causal
// WeightedLshCumulationCpu (unscaled). Per bucket, queries in walk order with
// counts[r] = the bucket's keys they see; the keys up to the last count are taken
// in chunks of kKeyChunk, and each query is finished in the chunk that holds its
// last key: acc_r += qw_r^T state (the [W, D] sum of kw_j (x) v_j over the earlier
// chunks, when the state is cheaper) + sum_j <qw_r, kw_j> v_j over its keys of the
// chunk (over all its keys, chunk by chunk, pair by pair). Pairs are computed for
// kCausalTile queries at a time, then applied in segments of keys so that each query
// sums exactly its own keys: no later key reaches it, not even with weight 0.
// The products run on called register tiles (MultiplyAccumulate): inlined
// into this function, GCC left some of them scalar (2x slower on large buckets).
KY_CPU_CLONES inline void CausalWeightedCumulationHashes(
    const CumulationDims& d, int64_t causal, int64_t b, int64_t h0, int64_t h1,
    const float* query_mask, const int32_t* query_codes, const float* query_weight,
    const float* key_mask, const int32_t* key_codes, const float* key_weight, const float* value,
    float* acc, WeightedScratch* s) {
  const int64_t w = d.weight_dim, dim = d.value_dim, padded = RoundUp(dim, kLanes);
  const bool copy_values = padded != dim;
  PrepareWeightedScratch(d, w, padded, copy_values, s);
  s->counts.resize(d.num_queries);
  s->tile_pairs.assign(kCausalTile * kKeyChunk, 0.0f);
  s->tile_rows.resize(kCausalTile);
  s->shifted_rows.resize(kCausalTile);
  for (int64_t t = 0; t < kCausalTile; ++t) s->tile_rows[t] = s->tile_pairs.data() + t * kKeyChunk;
  int64_t* counts = s->counts.data();
  float* table = s->table.data();
  const float** value_rows = s->value_rows.data();
  const float** query_rows = s->query_rows.data();
  float** acc_rows = s->acc_rows.data();
  const float* const* key_weight_rows = s->key_weight_rows.data();
  float* const* table_rows = s->table_rows.data();
  float* const* tile_rows = s->tile_rows.data();
  const float** shifted = s->shifted_rows.data();

  const float* qw = query_weight + b * d.num_queries * w;
  const float* kw = key_weight + b * d.num_keys * w;
  const float* v = value + b * d.num_keys * dim;
  for (int64_t h = h0; h < h1; ++h) {
    SharedBuckets bucket = SortBuckets(d, b, h, query_mask, query_codes, key_mask, key_codes, causal < 0, s);
    while (bucket.Next()) {
      // One bucket: queries[qa, qb) and keys[ka, kb), both in walk order.
      const int64_t nq = bucket.qb - bucket.qa, nk = bucket.kb - bucket.ka;
      const int64_t* bucket_queries = bucket.queries + bucket.qa;
      const int64_t* bucket_keys = bucket.keys + bucket.ka;
      for (int64_t r = 0, c = 0; r < nq; ++r) {
        while (c < nk && KeyBeforeQuery(bucket_keys[c], bucket_queries[r], causal)) ++c;
        counts[r] = c;
      }
      const int64_t needed = counts[nq - 1];  // keys the bucket's last query sees
      if (needed == 0) continue;
      for (int64_t r = 0; r < nq; ++r) {
        query_rows[r] = qw + bucket_queries[r] * w;
        acc_rows[r] = acc + bucket_queries[r] * padded;
      }
      const bool use_state = CausalStateIsCheaper(counts, nq, w, padded);
      if (use_state) std::fill_n(table, w * padded, 0.0f);
      int64_t ra = 0;
      for (int64_t k0 = 0; k0 < needed; k0 += kKeyChunk) {
        const int64_t chunk = std::min(kKeyChunk, needed - k0);
        LoadKeyChunk(bucket.ka + k0, chunk, kw, v, w, dim, padded, copy_values, s);
        // Queries [ra, rb) take keys of this chunk; with the state, only those whose last
        // key is in it (the later ones read the state in a later chunk).
        while (ra < nq && counts[ra] <= k0) ++ra;
        int64_t rb = nq;
        if (use_state) {
          rb = ra;
          while (rb < nq && counts[rb] <= k0 + chunk) ++rb;
          // acc += Q state: the keys of the earlier chunks.
          if (k0 > 0 && rb > ra) {
            MultiplyAccumulate(acc_rows + ra, query_rows + ra, rb - ra, w, table_rows,
                                     padded);
          }
        }
        for (int64_t r0 = ra; r0 < rb; r0 += kCausalTile) {
          const int64_t rows = std::min(kCausalTile, rb - r0);
          int64_t local[kCausalTile];  // keys of this chunk each row takes, nondecreasing
          for (int64_t t = 0; t < rows; ++t) local[t] = std::min(counts[r0 + t], k0 + chunk) - k0;
          CausalPairTile(query_rows + r0, acc_rows + r0, rows, local, w, key_weight_rows,
                         value_rows, padded, tile_rows, shifted);
        }
        if (use_state && k0 + chunk < needed) {
          // state += K_chunk^T V_chunk
          MultiplyAccumulate(table_rows, key_weight_rows, w, chunk, value_rows, padded);
        }
      }
    }
  }
}

}  // namespace internal

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_CAUSAL_CPU_H_
