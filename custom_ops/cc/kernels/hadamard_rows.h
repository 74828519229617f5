// The row form of the GPU Hadamard hash (appendix §1.2): each row's transform runs in registers,
// one thread per row up to padded_dim 64, and kParts = padded_dim / 64 neighbouring threads of a
// warp per row above (128 and 256), each holding 64 of the row's values and exchanging them with
// warp shuffles for the butterflies that cross their parts. No barrier inside a transform, each
// code word stored once (no atomics, no zeroing pass). Plain C++ with KY_HOST_DEVICE functions:
// the CUDA kernel of yoso_gpu.cu calls them per thread, and tests/test_hadamard_rows.py runs the
// same functions on the CPU, thread by thread (the parts of a row as threads exchanging through a
// barrier, as the shuffles do), against the float64 reference.
//
// A block of kRowHadamardThreads threads takes RowHadamardRowsPerBlock(P) consecutive rows of
// x [B*N, d] (thread i: row i / kParts, part i % kParts), in three steps with a barrier between:
//   1. StageRows: the threads copy those rows, contiguous in x, into shared memory as
//      staged [P, rows + 1] floats (coalesced reads; the +1 keeps both the writes and the per-row
//      reads free of bank conflicts);
//   2. HashStagedRow: each thread computes its part of y_q = H D3 H D2 H D1 pad(x_r) for every
//      block q of signs and ORs its sign bits into its own column of lane_codes [m, threads];
//   3. WriteRowCodes: the threads of a row store its m codes (the OR of their columns) into
//      codes [B, m, N]; for each hash, the block's rows are neighbouring words.
// The transform runs in double with the same butterflies, in the same order, as the block form
// (BlockFastHadamardTransform): the bits are those of the CPU kernel and of the reference.
#ifndef KERAS_YOSO_KERNELS_HADAMARD_ROWS_H_
#define KERAS_YOSO_KERNELS_HADAMARD_ROWS_H_

#include <cstdint>

#include "yoso_common.h"

#if defined(__CUDACC__)
#define KY_ROWS_UNROLL _Pragma("unroll")
#else
#define KY_ROWS_UNROLL _Pragma("GCC unroll 64")
#endif

namespace keras_yoso {

// Threads per block of the row form.
constexpr int kRowHadamardThreads = 64;
// Values of a row one thread holds at most: wider rows are split into parts of this many.
constexpr int kRowHadamardPart = 64;
// Largest padded_dim of the row form: 4 parts per row.
constexpr int kRowHadamardMaxPaddedDim = 256;

// Threads per row (parts) and rows per block of the row form at padded_dim p.
KY_HOST_DEVICE constexpr int RowHadamardParts(int64_t padded_dim) {
  return padded_dim > kRowHadamardPart ? static_cast<int>(padded_dim / kRowHadamardPart) : 1;
}
KY_HOST_DEVICE constexpr int RowHadamardRowsPerBlock(int64_t padded_dim) {
  return kRowHadamardThreads / RowHadamardParts(padded_dim);
}

// Shared memory of one block of the row form, in bytes: staged [padded_dim, rows + 1] floats, then
// lane_codes [m, kRowHadamardThreads] int32.
KY_HOST_DEVICE inline int64_t RowHadamardSharedBytes(int64_t padded_dim, int64_t num_hashes) {
  return padded_dim * (RowHadamardRowsPerBlock(padded_dim) + 1) * 4 + num_hashes * kRowHadamardThreads * 4;
}

// In-place unnormalized fast Walsh-Hadamard transform of y[0, P), Sylvester order
// (H_2n = [[H_n, H_n], [H_n, -H_n]]), butterflies of width 1, 2, 4, ... as in the block form.
template <int P>
KY_HOST_DEVICE inline void RegisterHadamard(double (&y)[P]) {
  KY_ROWS_UNROLL for (int len = 1; len < P; len <<= 1) {
    KY_ROWS_UNROLL for (int i = 0; i < P; ++i) {
      if (i & len) continue;
      const double a = y[i];
      const double b = y[i + len];
      y[i] = a + b;
      y[i + len] = a - b;
    }
  }
}

// The same transform of a row of kParts * kPart values split over kParts threads, this one holding
// part `part` in y: the butterflies inside the part, then those of width kPart, 2 kPart, ... across
// parts, where exchange(v, span) returns the value v of the thread whose part is part ^ span (a warp
// shuffle on the GPU); the lower part keeps a + b, the upper a - b, as RegisterHadamard does.
template <int kPart, int kParts, typename Exchange>
KY_HOST_DEVICE inline void SplitHadamard(double (&y)[kPart], int part, Exchange& exchange) {
  RegisterHadamard<kPart>(y);
  KY_ROWS_UNROLL for (int span = 1; span < kParts; span <<= 1) {
    const bool upper = (part & span) != 0;
    KY_ROWS_UNROLL for (int t = 0; t < kPart; ++t) {
      const double other = exchange(y[t], span);
      y[t] = upper ? other - y[t] : y[t] + other;
    }
  }
}

// Step 1 for thread `thread` of `threads`: copies rows [row0, row0 + count) of x [rows, d], where
// count = min(RowHadamardRowsPerBlock(P), rows - row0), into staged[c * (rows per block + 1) + r]
// (row row0 + r, column c < d) as floats. load(i) returns element i of x as a float.
template <typename Load>
KY_HOST_DEVICE inline void StageRows(const HashDims& d, Load load, int64_t row0, int thread, int threads,
                                     float* staged) {
  const int per_block = RowHadamardRowsPerBlock(d.padded_dim);
  const int64_t rows = d.batch * d.length;
  const int count = static_cast<int>(rows - row0 < per_block ? rows - row0 : per_block);
  const int dim = static_cast<int>(d.dim);
  const int64_t base = row0 * d.dim;
  for (int e = thread; e < count * dim; e += threads) {
    const int r = e / dim;
    const int c = e - r * dim;
    staged[c * (per_block + 1) + r] = load(base + e);
  }
}

// Step 2 for thread `thread`: its part of row row0 + thread / kParts (nothing when that is past the
// last row: the row's threads return together, so the exchanges stay among the row's threads),
// from staged. signs [num_blocks, 3, P] (+-1, P = d.padded_dim); bit g = HadamardBitOfRow(d, q, t)
// < m * tau is bit g % tau of hash g / tau. lane_codes: the block's [m, kRowHadamardThreads]
// int32, of which the thread fills its own column. exchange: see SplitHadamard.
template <int P, typename Exchange>
KY_HOST_DEVICE inline void HashStagedRow(const HashDims& d, const float* signs, const float* staged, int64_t row0,
                                         int thread, int32_t* lane_codes, Exchange& exchange) {
  constexpr int kParts = RowHadamardParts(P);
  constexpr int kPart = P / kParts;
  constexpr int kStride = RowHadamardRowsPerBlock(P) + 1;
  const int r = thread / kParts;
  const int part = thread % kParts;
  if (row0 + r >= d.batch * d.length) return;
  const int tau = static_cast<int>(d.hash_code_len);
  const int bits = static_cast<int>(d.num_hashes) * tau;
  const int dim = static_cast<int>(d.dim);
  int32_t* own = lane_codes + thread;
  for (int h = 0; h < d.num_hashes; ++h) own[h * kRowHadamardThreads] = 0;
  for (int q = 0; q < d.num_blocks; ++q) {
    const float* s = signs + q * 3 * P + part * kPart;
    double y[kPart];
    KY_ROWS_UNROLL for (int t = 0; t < kPart; ++t) {
      const int column = part * kPart + t;
      y[t] = static_cast<double>(column < dim ? staged[column * kStride + r] : 0.0f) * s[t];
    }
    SplitHadamard<kPart, kParts>(y, part, exchange);
    KY_ROWS_UNROLL for (int stage = 1; stage < 3; ++stage) {
      KY_ROWS_UNROLL for (int t = 0; t < kPart; ++t) y[t] *= s[stage * P + t];
      SplitHadamard<kPart, kParts>(y, part, exchange);
    }
    KY_ROWS_UNROLL for (int t = 0; t < kPart; ++t) {
      const int g = static_cast<int>(HadamardBitOfRow(d, q, part * kPart + t));
      if (g < bits && y[t] > 0.0) own[(g / tau) * kRowHadamardThreads] |= int32_t{1} << (g % tau);
    }
  }
}

// Step 3 for thread `thread`: stores the hashes h = part, part + kParts, ... of its row (the OR of
// the row's threads' columns of lane_codes) into codes [B, m, N].
template <int P>
KY_HOST_DEVICE inline void WriteRowCodes(const HashDims& d, int64_t row0, int thread, const int32_t* lane_codes,
                                         int32_t* codes) {
  constexpr int kParts = RowHadamardParts(P);
  const int r = thread / kParts;
  const int part = thread % kParts;
  const int64_t row = row0 + r;
  if (row >= d.batch * d.length) return;
  const int64_t b = row / d.length;
  const int64_t n = row - b * d.length;
  int32_t* out = codes + b * d.num_hashes * d.length + n;
  const int32_t* columns = lane_codes + r * kParts;
  for (int h = part; h < d.num_hashes; h += kParts) {
    int32_t code = 0;
    KY_ROWS_UNROLL for (int p = 0; p < kParts; ++p) code |= columns[h * kRowHadamardThreads + p];
    out[h * d.length] = code;
  }
}

// True when the row form takes this call: d <= padded_dim <= kRowHadamardMaxPaddedDim and its
// block's shared memory fits `shared_limit` bytes; other calls take the block form.
KY_HOST_DEVICE inline bool UsesRowHadamard(const HashDims& d, int64_t shared_limit) {
  return d.dim <= d.padded_dim && d.padded_dim <= kRowHadamardMaxPaddedDim &&
         RowHadamardSharedBytes(d.padded_dim, d.num_hashes) <= shared_limit;
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_HADAMARD_ROWS_H_
