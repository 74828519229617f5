// The shared pieces of the CPU kernels (yoso_cpu.h says how they run): the x86-64 clone
// macros, the code check, float conversion, the work-unit cost, the radix sort of positions by code
// and the register tiles of MultiplyAccumulate, with the per-bucket scratch of the weighted and
// causal cumulations. Plain C++; no framework include.
#ifndef KERAS_YOSO_KERNELS_CPU_TILES_H_
#define KERAS_YOSO_KERNELS_CPU_TILES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>
#include "yoso_common.h"

namespace keras_yoso {

// KY_CPU_CLONES: compile a float-only hot function for several x86-64 levels.
// KY_CPU_INLINE: always inline, so a helper is compiled for its caller's level.
// KY_UNROLL: unroll a fixed-count loop fully (register tiles).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(KY_NO_CLONES)
#define KY_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KY_CPU_CLONES
#endif
#if defined(__GNUC__) || defined(__clang__)
#define KY_CPU_INLINE inline __attribute__((always_inline))
#define KY_NOINLINE __attribute__((noinline))
#define KY_UNROLL _Pragma("GCC unroll 64")
#else
#define KY_CPU_INLINE inline
#define KY_NOINLINE
#define KY_UNROLL
#endif

// Floats of one CPU worker's bucket table; column blocks are sized to fit it.
constexpr int64_t kCpuTableFloats = int64_t{1} << 20;

// Number of codes in codes[0, count) outside [0, num_buckets).
inline int64_t CountInvalidCodes(const int32_t* codes, int64_t count, int64_t num_buckets) {
  int64_t invalid = 0;
  for (int64_t i = 0; i < count; ++i) invalid += (codes[i] < 0 || codes[i] >= num_buckets);
  return invalid;
}

namespace internal {

// Column block of the value dimension so one [num_buckets, width] table fits kCpuTableFloats.
inline int64_t ValueColumnBlock(int64_t num_buckets, int64_t value_dim, int64_t rows_per_bucket) {
  const int64_t fit = kCpuTableFloats / (num_buckets * rows_per_bucket);
  return std::max<int64_t>(1, std::min<int64_t>(value_dim, std::min<int64_t>(fit, 64)));
}

// x as float: x itself for float, else a converted copy in *buffer.
template <typename T, typename ParallelFor>
const float* AsFloat(const T* x, int64_t count, std::vector<float>* buffer, ParallelFor&& pf) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    buffer->resize(count);
    float* y = buffer->data();
    pf(count, 2, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = static_cast<float>(x[i]);
    });
    return y;
  }
}

// Floats in one register tile of MultiplyAccumulate (one AVX-512 register).
constexpr int64_t kLanes = 16;
// Keys of a bucket taken at a time: their [W, kKeyChunk] weights and
// [kKeyChunk, D] values stay in L1 while the bucket's queries use them.
constexpr int64_t kKeyChunk = 64;
// Keys ahead whose rows are prefetched while a chunk is gathered: buckets list
// keys in random order, which the hardware prefetcher cannot follow.
constexpr int64_t kPrefetchKeys = 8;
// Hashes of WeightedLshCumulationCpu are split into this many groups, each a
// separate work unit, so that even batch 1 keeps two cores busy.
constexpr int64_t kHashGroups = 2;
// Digit width of SortPositionsByCode's radix sort.
constexpr int kRadixBits = 8;

inline int64_t RoundUp(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// A ParallelFor cost estimate, computed in double and capped (no int64 overflow).
inline int64_t CostPerUnit(double operations) {
  return static_cast<int64_t>(std::min(operations, 1e15)) + 1;
}

// Asks for the cache lines of row[0, count) ahead of use.
inline void PrefetchRow(const float* row, int64_t count) {
#if defined(__GNUC__) || defined(__clang__)
  for (int64_t c = 0; c < count; c += 16) __builtin_prefetch(row + c);
#endif
}

// *order = the positions p in [0, n) with keep[p] != 0 and a valid code,
// stably sorted by codes[p] (LSD radix sort, O(n log2(num_buckets) / kRadixBits)):
// ascending codes, and inside one code ascending positions (descending when
// `descending`, the walk order of an anti-causal cumulation).
inline void SortPositionsByCode(const int32_t* codes, const float* keep, int64_t n,
                                int64_t num_buckets, std::vector<int64_t>* order,
                                std::vector<int64_t>* scratch, bool descending = false) {
  order->clear();
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = descending ? n - 1 - t : t;
    if (keep[p] != 0.0f && ValidCode(codes[p], num_buckets)) order->push_back(p);
  }
  const int64_t count = static_cast<int64_t>(order->size());
  scratch->resize(count);
  int64_t* src = order->data();
  int64_t* dst = scratch->data();
  constexpr int64_t kRadix = int64_t{1} << kRadixBits;
  for (int shift = 0; (int64_t{1} << shift) < num_buckets; shift += kRadixBits) {
    int64_t start[kRadix + 1] = {};
    for (int64_t c = 0; c < count; ++c) ++start[((codes[src[c]] >> shift) & (kRadix - 1)) + 1];
    for (int64_t r = 0; r < kRadix; ++r) start[r + 1] += start[r];
    for (int64_t c = 0; c < count; ++c) {
      dst[start[(codes[src[c]] >> shift) & (kRadix - 1)]++] = src[c];
    }
    std::swap(src, dst);
  }
  if (src != order->data()) std::copy(src, src + count, order->data());
}

// rows[r][c0 + c] += sum_{j < count} coef[r][j] * vals[j][c0 + c] for r < R and
// c < kVecs * kLanes: one register tile of MultiplyAccumulate.
template <int R, int kVecs>
KY_CPU_INLINE void MultiplyAccumulateTile(float* const* rows, const float* const* coef,
                                          int64_t count, const float* const* vals, int64_t c0) {
  constexpr int kCols = kVecs * static_cast<int>(kLanes);
  // Fully unrolled over r and c, so the sums stay in registers.
  float acc[R][kCols];
  KY_UNROLL for (int r = 0; r < R; ++r) {
    KY_UNROLL for (int c = 0; c < kCols; ++c) acc[r][c] = rows[r][c0 + c];
  }
  for (int64_t j = 0; j < count; ++j) {
    const float* v = vals[j] + c0;
    KY_UNROLL for (int r = 0; r < R; ++r) {
      const float a = coef[r][j];
      KY_UNROLL for (int c = 0; c < kCols; ++c) acc[r][c] += a * v[c];
    }
  }
  KY_UNROLL for (int r = 0; r < R; ++r) {
    KY_UNROLL for (int c = 0; c < kCols; ++c) rows[r][c0 + c] = acc[r][c];
  }
}

// MultiplyAccumulateTile as a function of its own, compiled for each x86-64 level. GCC keeps a
// tile's sums in vector registers when it compiles the tile alone, but not always once many
// tiles are inlined into one large function (GCC 12 leaves some 1- and 2-row tiles scalar there),
// so every caller goes through this call.
template <int R, int kVecs>
KY_CPU_CLONES KY_NOINLINE void MultiplyAccumulateTileCall(float* const* rows,
                                                          const float* const* coef, int64_t count,
                                                          const float* const* vals, int64_t c0) {
  MultiplyAccumulateTile<R, kVecs>(rows, coef, count, vals, c0);
}

// True where the tiles' x86-64-v4 clones run (32 vector registers of 16 floats); elsewhere (the v3
// clones: AVX2, 16 registers of 8 floats; builds without KY_CPU_CLONES) a tile needs 2-4x the
// registers for the same sums.
inline bool WideVectorRegisters() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(KY_NO_CLONES)
  static const bool wide = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") != 0;
  }();
  return wide;
#else
  return false;
#endif
}

// Rows of one register tile of kVecs * kLanes columns. AVX-512 (wide): 8 rows up to 2 vectors (16
// of 32 zmm hold sums), then 4. AVX2, for long products (kLongProduct): 8 rows of 1 vector (16 ymm),
// 2 of 2 (8 ymm), then 1: 8 rows of 2 or more vectors would keep 32 or more ymm of sums, spilling
// most of them to the stack, a load and a store per multiply-add.
template <int kVecs>
constexpr int TileRows(bool wide) {
  return wide ? (kVecs <= 2 ? 8 : 4) : (kVecs == 1 ? 8 : (kVecs == 2 ? 2 : 1));
}

// Terms of a product (its `count`) from which AVX2 takes its own TileRows. Shorter products (a
// bucket's 8-16 keys) keep AVX-512's rows: there the extra calls of smaller tiles cost more than the
// spills (measured with benchmarks/native_ab.py, docs/benchmarks.md).
constexpr int64_t kLongProduct = 32;

// MultiplyAccumulate on the columns [c0, c0 + kVecs * kLanes) in row tiles of kRows rows, the
// remaining rows in tiles of kRows / 2, kRows / 4, ..., 1.
template <int kRows, int kVecs>
KY_CPU_INLINE void MultiplyAccumulateRowTiles(float* const* rows, const float* const* coef, int64_t num_rows,
                                              int64_t count, const float* const* vals, int64_t c0) {
  int64_t r = 0;
  for (; r + kRows <= num_rows; r += kRows) {
    MultiplyAccumulateTileCall<kRows, kVecs>(rows + r, coef + r, count, vals, c0);
  }
  if constexpr (kRows > 1) {
    if (r < num_rows) {
      MultiplyAccumulateRowTiles<kRows / 2, kVecs>(rows + r, coef + r, num_rows - r, count, vals, c0);
    }
  }
}

// MultiplyAccumulate on the columns [c0, c0 + kVecs * kLanes), in the row tiles of this CPU and
// product length (TileRows, kLongProduct). Every element is summed over j in the same order whatever
// the tile.
template <int kVecs>
KY_CPU_INLINE void MultiplyAccumulateColumns(float* const* rows, const float* const* coef,
                                             int64_t num_rows, int64_t count,
                                             const float* const* vals, int64_t c0) {
  if (WideVectorRegisters() || count < kLongProduct) {
    MultiplyAccumulateRowTiles<TileRows<kVecs>(true), kVecs>(rows, coef, num_rows, count, vals, c0);
  } else {
    MultiplyAccumulateRowTiles<TileRows<kVecs>(false), kVecs>(rows, coef, num_rows, count, vals, c0);
  }
}

// rows[r][c] += sum_{j < count} coef[r][j] * vals[j][c] for r < num_rows and
// c < cols (a multiple of kLanes): a small matrix product over row pointers.
// Every element is summed over j in order, whatever the tiling or vector width.
KY_CPU_INLINE void MultiplyAccumulate(float* const* rows, const float* const* coef,
                                      int64_t num_rows, int64_t count, const float* const* vals,
                                      int64_t cols) {
  for (int64_t c0 = 0; c0 < cols; c0 += 4 * kLanes) {
    const int64_t n = num_rows;
    switch ((cols - c0) / kLanes) {
      case 1: MultiplyAccumulateColumns<1>(rows, coef, n, count, vals, c0); break;
      case 2: MultiplyAccumulateColumns<2>(rows, coef, n, count, vals, c0); break;
      case 3: MultiplyAccumulateColumns<3>(rows, coef, n, count, vals, c0); break;
      default: MultiplyAccumulateColumns<4>(rows, coef, n, count, vals, c0); break;
    }
  }
}

// True when bucket (nq queries, nk keys) costs fewer multiply-adds through its
// table K^T V than pair by pair (pair weights are computed kLanes keys at a time).
inline bool TableIsCheaper(int64_t nq, int64_t nk, int64_t w, int64_t padded_dim) {
  return (nq + nk) * w * padded_dim < nq * (RoundUp(nk, kLanes) * w + nk * padded_dim);
}

// Query rows of a causal bucket whose pair weights are computed and applied together.
constexpr int64_t kCausalTile = 4;
// Value columns of one causal LshCumulationCpu work unit: its running state [width].
constexpr int64_t kCausalColumns = 64;

// Working memory of one WeightedLshCumulationCpu worker. Dp = D rounded up to kLanes.
struct WeightedScratch {
  std::vector<int64_t> queries, keys, sort_buffer;  // positions sorted by code
  std::vector<const float*> key_rows;               // [kKeyChunk]: a chunk's key weight rows
  std::vector<float> key_weights;                   // [W, kKeyChunk]: their weights, transposed
  std::vector<float> values;                        // [kKeyChunk, Dp]: their values, if D != Dp
  std::vector<float> table;                         // [W, Dp]: K^T V of a bucket
  std::vector<float> pair_weights;                  // [nq, kKeyChunk]: <qw_i, kw_j> of a bucket
  std::vector<const float*> query_rows, value_rows, key_weight_rows;
  std::vector<float*> acc_rows, table_rows, pair_rows;
  // Causal only (CausalWeightedCumulationHashes):
  std::vector<int64_t> counts;              // [nq]: keys of a bucket each query sees
  std::vector<float> tile_pairs;            // [kCausalTile, kKeyChunk]: <qw_i, kw_j> of a row tile
  std::vector<float*> tile_rows;            // its rows
  std::vector<const float*> shifted_rows;   // its rows from a key offset on
};

// Sizes the buffers of *s shared by both weighted walks (bidirectional and causal) for
// weight width w and padded value width Dp, and points the row tables into them.
inline void PrepareWeightedScratch(const CumulationDims& d, int64_t w, int64_t padded, bool copy_values,
                                   WeightedScratch* s) {
  s->key_rows.resize(kKeyChunk);
  s->key_weights.assign(w * kKeyChunk, 0.0f);
  s->values.assign(copy_values ? kKeyChunk * padded : 0, 0.0f);
  s->table.resize(w * padded);
  s->value_rows.resize(kKeyChunk);
  s->query_rows.resize(d.num_queries);
  s->acc_rows.resize(d.num_queries);
  s->key_weight_rows.resize(w);
  s->table_rows.resize(w);
  for (int64_t k = 0; k < w; ++k) {
    s->key_weight_rows[k] = s->key_weights.data() + k * kKeyChunk;
    s->table_rows[k] = s->table.data() + k * padded;
  }
}

// The buckets of one (row, hash) of a weighted walk, in ascending code order. SortBuckets(d, b, h, ...)
// sorts the kept queries and keys of batch row b and hash h by code (SortPositionsByCode into s->queries / s->keys;
// inside a code, descending positions when `descending`); each Next() then finds the next
// code both sides hold: the bucket s->queries[qa, qb) and s->keys[ka, kb). An iterator,
// not a callback, so the bucket's work stays in the caller's KY_CPU_CLONES code.
struct SharedBuckets {
  const int32_t* qc;
  const int32_t* kc;
  const int64_t* queries;
  const int64_t* keys;
  int64_t num_q, num_k;
  int64_t qa = 0, qb = 0, ka = 0, kb = 0;

  KY_CPU_INLINE bool Next() {
    qa = qb;
    ka = kb;
    while (qa < num_q && ka < num_k) {
      const int32_t code = qc[queries[qa]];
      if (code != kc[keys[ka]]) {
        (code < kc[keys[ka]] ? qa : ka) += 1;
        continue;
      }
      qb = qa + 1;
      kb = ka + 1;
      while (qb < num_q && qc[queries[qb]] == code) ++qb;
      while (kb < num_k && kc[keys[kb]] == code) ++kb;
      return true;
    }
    return false;
  }
};

inline SharedBuckets SortBuckets(const CumulationDims& d, int64_t b, int64_t h, const float* query_mask,
                                 const int32_t* query_codes, const float* key_mask, const int32_t* key_codes,
                                 bool descending, WeightedScratch* s) {
  const float* qm = query_mask + b * d.num_queries;
  const float* km = key_mask + b * d.num_keys;
  const int32_t* qc = query_codes + (b * d.num_hashes + h) * d.num_queries;
  const int32_t* kc = key_codes + (b * d.num_hashes + h) * d.num_keys;
  SortPositionsByCode(qc, qm, d.num_queries, d.num_buckets, &s->queries, &s->sort_buffer, descending);
  SortPositionsByCode(kc, km, d.num_keys, d.num_buckets, &s->keys, &s->sort_buffer, descending);
  return SharedBuckets{qc, kc, s->queries.data(), s->keys.data(), static_cast<int64_t>(s->queries.size()),
                       static_cast<int64_t>(s->keys.size())};
}

#if defined(__GNUC__) && !defined(__clang__)
#define KY_HAS_TRANSPOSE16 1
// 16 floats (GCC vector extension: one AVX-512 register, two AVX2 ones, four SSE ones).
typedef float Vec16 __attribute__((vector_size(64)));
typedef int32_t Index16 __attribute__((vector_size(64)));

// rows[0, 16) := their transpose, in four stages: stage s swaps, in each 2^(s+1) block of rows
// and columns, the two off-diagonal 2^s x 2^s blocks (bit s of the row and column index traded).
KY_CPU_INLINE void Transpose16(Vec16* rows) {
  constexpr Index16 kLow[4] = {
      {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
      {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
      {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
      {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}};
  constexpr Index16 kHigh[4] = {
      {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31},
      {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
      {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
      {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}};
  KY_UNROLL for (int stage = 0; stage < 4; ++stage) {
    const int half = 1 << stage;
    KY_UNROLL for (int i = 0; i < 16; ++i) {
      if (i & half) continue;
      const Vec16 a = rows[i], b = rows[i + half];
      rows[i] = __builtin_shuffle(a, b, kLow[stage]);
      rows[i + half] = __builtin_shuffle(a, b, kHigh[stage]);
    }
  }
}
#else
#define KY_HAS_TRANSPOSE16 0
#endif

// dst[c * dst_stride + j] = rows[j][c] for j < count and c < width: rows gathered from anywhere,
// transposed. Whole 16 x 16 blocks go through registers (16 loads, 64 shuffles, 16 stores, not
// 256 scalar moves); the rest element by element.
KY_CPU_INLINE void TransposeRows(const float* const* rows, int64_t count, int64_t width, float* dst,
                                 int64_t dst_stride) {
  int64_t j0 = 0, c_whole = 0;
#if KY_HAS_TRANSPOSE16
  c_whole = width / 16 * 16;
  for (; j0 + 16 <= count; j0 += 16) {
    for (int64_t c0 = 0; c0 < c_whole; c0 += 16) {
      Vec16 block[16];
      for (int r = 0; r < 16; ++r) std::memcpy(&block[r], rows[j0 + r] + c0, sizeof(Vec16));
      Transpose16(block);
      for (int r = 0; r < 16; ++r) std::memcpy(dst + (c0 + r) * dst_stride + j0, &block[r], sizeof(Vec16));
    }
    for (int64_t c = c_whole; c < width; ++c) {
      for (int64_t j = j0; j < j0 + 16; ++j) dst[c * dst_stride + j] = rows[j][c];
    }
  }
#endif
  for (int64_t c = 0; c < width; ++c) {
    for (int64_t j = j0; j < count; ++j) dst[c * dst_stride + j] = rows[j][c];
  }
}

// Loads the keys s->keys[start, start + chunk) of a weighted walk for the products:
// s->value_rows[j] -> their values (copied padded to Dp when D != Dp), and their
// weights transposed into s->key_weights (row k: feature k of the chunk's keys).
// Prefetches the rows kPrefetchKeys keys ahead in s->keys.
KY_CPU_INLINE void LoadKeyChunk(int64_t start, int64_t chunk, const float* kw, const float* v, int64_t w, int64_t dim,
                                int64_t padded, bool copy_values, WeightedScratch* s) {
  // Local pointers: the stores below must not make the compiler re-read the vectors' fields.
  const int64_t* keys = s->keys.data();
  const int64_t num_k = static_cast<int64_t>(s->keys.size());
  const float** key_rows = s->key_rows.data();
  float* key_weights = s->key_weights.data();
  float* values = s->values.data();
  const float** value_rows = s->value_rows.data();
  for (int64_t j = 0; j < chunk; ++j) {
    if (start + j + kPrefetchKeys < num_k) {
      const int64_t ahead = keys[start + j + kPrefetchKeys];
      PrefetchRow(kw + ahead * w, w);
      PrefetchRow(v + ahead * dim, dim);
    }
    const int64_t key = keys[start + j];
    key_rows[j] = kw + key * w;
    if (copy_values) {
      std::copy(v + key * dim, v + (key + 1) * dim, values + j * padded);
      value_rows[j] = values + j * padded;
    } else {
      value_rows[j] = v + key * dim;
    }
  }
  TransposeRows(key_rows, chunk, w, key_weights, kKeyChunk);
}

}  // namespace internal

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_CPU_TILES_H_
