// CPU algorithms of the keras-yoso ops: plain C++ templates over raw pointers.
// No TensorFlow include; the TF wrappers (yoso_kernels.cc) pass a ParallelFor
// that runs on TF's worker pool.
//
// ParallelFor is any callable `pf(int64_t units, int64_t cost_per_unit,
// std::function<void(int64_t begin, int64_t end)>)` that runs every unit in
// [0, units) exactly once. Each unit writes a disjoint part of the output (or,
// in WeightedLshCumulationCpu, of a partial sum that a second pass adds in a
// fixed order), and the split into units depends on the shapes only, so every
// element is summed in the same order and results are bitwise identical for any
// number of threads. Element type T is float, Eigen::half or Eigen::bfloat16
// (anything with static_cast to and from float); all sums are float32.
//
// The hot loops (KY_CPU_CLONES) are compiled for x86-64-v4 (AVX-512),
// x86-64-v3 (AVX2 + FMA) and baseline x86-64, and the best one for the CPU is
// picked at load time (GCC function multiversioning); the rest of the library
// stays baseline. The hash codes and LshCumulationCpu give the same bits on
// every version; WeightedLshCumulationCpu may differ in the last bits between
// CPUs of different levels (fused multiply-adds), never between runs on one.
// Define KY_NO_CLONES to build the baseline version only (e.g. for toolchains
// without ifunc support).
#ifndef KERAS_YOSO_KERNELS_YOSO_CPU_H_
#define KERAS_YOSO_KERNELS_YOSO_CPU_H_

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

// MultiplyAccumulateTile as a function of its own, compiled for each x86-64 level.
// GCC keeps a tile's sums in vector registers when it compiles the tile alone, but
// not always once many tiles are inlined into one large function (GCC 12 leaves
// some 1- and 2-row tiles scalar there); the causal kernel calls these instead.
template <int R, int kVecs>
KY_CPU_CLONES KY_NOINLINE void MultiplyAccumulateTileCall(float* const* rows,
                                                          const float* const* coef, int64_t count,
                                                          const float* const* vals, int64_t c0) {
  MultiplyAccumulateTile<R, kVecs>(rows, coef, count, vals, c0);
}

// One tile, inlined into the caller or (kOutlined) called.
template <int R, int kVecs, bool kOutlined>
KY_CPU_INLINE void RunTile(float* const* rows, const float* const* coef, int64_t count,
                           const float* const* vals, int64_t c0) {
  if constexpr (kOutlined) {
    MultiplyAccumulateTileCall<R, kVecs>(rows, coef, count, vals, c0);
  } else {
    MultiplyAccumulateTile<R, kVecs>(rows, coef, count, vals, c0);
  }
}

// MultiplyAccumulate on the columns [c0, c0 + kVecs * kLanes), in row tiles of
// up to 16 / kVecs rows (at most 8): about 16 vector registers of sums.
template <int kVecs, bool kOutlined = false>
KY_CPU_INLINE void MultiplyAccumulateColumns(float* const* rows, const float* const* coef,
                                             int64_t num_rows, int64_t count,
                                             const float* const* vals, int64_t c0) {
  constexpr int kRows = kVecs <= 2 ? 8 : 4;
  int64_t r = 0;
  for (; r + kRows <= num_rows; r += kRows) {
    RunTile<kRows, kVecs, kOutlined>(rows + r, coef + r, count, vals, c0);
  }
  if (kRows == 8 && r + 4 <= num_rows) {
    RunTile<4, kVecs, kOutlined>(rows + r, coef + r, count, vals, c0);
    r += 4;
  }
  if (r + 2 <= num_rows) {
    RunTile<2, kVecs, kOutlined>(rows + r, coef + r, count, vals, c0);
    r += 2;
  }
  if (r < num_rows) RunTile<1, kVecs, kOutlined>(rows + r, coef + r, count, vals, c0);
}

// rows[r][c] += sum_{j < count} coef[r][j] * vals[j][c] for r < num_rows and
// c < cols (a multiple of kLanes): a small matrix product over row pointers.
// Every element is summed over j in order, whatever the tiling or vector width.
// kOutlined: each register tile is a call (MultiplyAccumulateTileCall).
template <bool kOutlined = false>
KY_CPU_INLINE void MultiplyAccumulate(float* const* rows, const float* const* coef,
                                      int64_t num_rows, int64_t count, const float* const* vals,
                                      int64_t cols) {
  for (int64_t c0 = 0; c0 < cols; c0 += 4 * kLanes) {
    const int64_t n = num_rows;
    switch ((cols - c0) / kLanes) {
      case 1: MultiplyAccumulateColumns<1, kOutlined>(rows, coef, n, count, vals, c0); break;
      case 2: MultiplyAccumulateColumns<2, kOutlined>(rows, coef, n, count, vals, c0); break;
      case 3: MultiplyAccumulateColumns<3, kOutlined>(rows, coef, n, count, vals, c0); break;
      default: MultiplyAccumulateColumns<4, kOutlined>(rows, coef, n, count, vals, c0); break;
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
  std::vector<int64_t> key_offsets;                 // [kKeyChunk]: a chunk's key rows
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
  s->key_offsets.resize(kKeyChunk);
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

// The buckets of one (row, hash) of a weighted walk, in ascending code order. SortBuckets
// sorts the kept queries and keys by code (SortPositionsByCode into s->queries / s->keys;
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

inline SharedBuckets SortBuckets(const int32_t* qc, const float* qm, int64_t num_queries, const int32_t* kc,
                                 const float* km, int64_t num_keys, int64_t num_buckets, bool descending,
                                 WeightedScratch* s) {
  SortPositionsByCode(qc, qm, num_queries, num_buckets, &s->queries, &s->sort_buffer, descending);
  SortPositionsByCode(kc, km, num_keys, num_buckets, &s->keys, &s->sort_buffer, descending);
  return SharedBuckets{qc, kc, s->queries.data(), s->keys.data(), static_cast<int64_t>(s->queries.size()),
                       static_cast<int64_t>(s->keys.size())};
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
  int64_t* offsets = s->key_offsets.data();
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
    offsets[j] = key * w;
    if (copy_values) {
      std::copy(v + key * dim, v + (key + 1) * dim, values + j * padded);
      value_rows[j] = values + j * padded;
    } else {
      value_rows[j] = v + key * dim;
    }
  }
  for (int64_t k = 0; k < w; ++k) {
    float* dst = key_weights + k * kKeyChunk;
    for (int64_t j = 0; j < chunk; ++j) dst[j] = kw[offsets[j] + k];
  }
}

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
          MultiplyAccumulate<true>(table_rows, key_weight_rows, w, chunk, value_rows, padded);
          continue;
        }
        // pair_weights = Q K_chunk^T, then acc += pair_weights V_chunk.
        float* const* pair_rows = s->pair_rows.data();
        std::fill_n(s->pair_weights.data(), nq * kKeyChunk, 0.0f);
        MultiplyAccumulate<true>(pair_rows, query_rows, nq, w, key_weight_rows, RoundUp(chunk, kLanes));
        MultiplyAccumulate<true>(acc_rows, pair_rows, nq, chunk, value_rows, padded);
      }
      if (use_table) {
        // acc += Q table
        MultiplyAccumulate<true>(acc_rows, query_rows, nq, w, table_rows, padded);
      }
    }
  }
}

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
  MultiplyAccumulate<true>(tile_rows, query_rows, rows, w, key_weight_rows, cols);
  for (int64_t t = 0, j0 = 0; t < rows; ++t) {
    const int64_t j1 = local[t];
    if (j1 <= j0) continue;
    for (int64_t u = t; u < rows; ++u) shifted[u - t] = tile_rows[u] + j0;
    MultiplyAccumulate<true>(acc_rows + t, shifted, rows - t, j1 - j0, value_rows + j0,
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
// The products run on called register tiles (MultiplyAccumulate<true>): inlined
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

  const float* qm = query_mask + b * d.num_queries;
  const float* km = key_mask + b * d.num_keys;
  const float* qw = query_weight + b * d.num_queries * w;
  const float* kw = key_weight + b * d.num_keys * w;
  const float* v = value + b * d.num_keys * dim;
  for (int64_t h = h0; h < h1; ++h) {
    const int32_t* qc = query_codes + (b * d.num_hashes + h) * d.num_queries;
    const int32_t* kc = key_codes + (b * d.num_hashes + h) * d.num_keys;
    SharedBuckets bucket = SortBuckets(qc, qm, d.num_queries, kc, km, d.num_keys, d.num_buckets, causal < 0, s);
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
            MultiplyAccumulate<true>(acc_rows + ra, query_rows + ra, rb - ra, w, table_rows,
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
          MultiplyAccumulate<true>(table_rows, key_weight_rows, w, chunk, value_rows, padded);
        }
      }
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

// LshCumulationCpu over every key (causal = 0).
template <typename T, typename ParallelFor>
void LshCumulationCpu(const CumulationDims& d, const float* query_mask,
                      const int32_t* query_codes, const float* key_mask,
                      const int32_t* key_codes, const T* value, T* out, ParallelFor&& pf) {
  LshCumulationCpu<T>(d, 0, query_mask, query_codes, key_mask, key_codes, value, out,
                      std::forward<ParallelFor>(pf));
}

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

// WeightedLshCumulationCpu over every key (causal = 0).
template <typename T, typename ParallelFor>
void WeightedLshCumulationCpu(const CumulationDims& d, const float* query_mask,
                              const int32_t* query_codes, const T* query_weight,
                              const float* key_mask, const int32_t* key_codes,
                              const T* key_weight, const T* value, T* out, ParallelFor&& pf) {
  WeightedLshCumulationCpu<T>(d, 0, query_mask, query_codes, query_weight, key_mask, key_codes,
                              key_weight, value, out, std::forward<ParallelFor>(pf));
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

#endif  // KERAS_YOSO_KERNELS_YOSO_CPU_H_
