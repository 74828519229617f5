// The row form of the GPU Hadamard hash (appendix §1.2): one thread hashes one row with the row's
// padded_dim values in registers, so a block needs no barrier inside a transform and writes each
// code word once (no atomics, no zeroing pass). Plain C++ with KY_HOST_DEVICE functions: the CUDA
// kernel of yoso_gpu.cu calls them per thread, and tests/test_hadamard_rows.py runs the same
// functions on the CPU, thread by thread, against the float64 reference.
//
// A block of kRowHadamardRows threads takes kRowHadamardRows consecutive rows of x [B*N, d]:
//   1. StageRows: the threads copy those rows, which are contiguous in x, into shared memory as
//      staged [padded_dim, kRowHadamardRows + 1] floats (coalesced reads; the +1 keeps both the
//      writes and the per-row reads free of bank conflicts);
//   2. a barrier;
//   3. HashStagedRow: thread r computes y_q = H D3 H D2 H D1 pad(x_r) for every block q of signs,
//      ORs its sign bits into its own column of lane_codes [m, kRowHadamardRows] and stores the m
//      codes into codes [B, m, N] (for each hash, the block's threads store neighbouring words).
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

// Rows (threads) per block of the row form.
constexpr int kRowHadamardRows = 64;
// Largest padded_dim of the row form: 64 doubles per thread stay in registers.
constexpr int kRowHadamardMaxPaddedDim = 64;

// Shared memory of one block of the row form, in bytes: staged [padded_dim, kRowHadamardRows + 1]
// floats, then lane_codes [m, kRowHadamardRows] int32.
KY_HOST_DEVICE inline int64_t RowHadamardSharedBytes(int64_t padded_dim, int64_t num_hashes) {
  return padded_dim * (kRowHadamardRows + 1) * 4 + num_hashes * kRowHadamardRows * 4;
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

// Step 1 for thread `thread` of `threads`: copies rows [row0, row0 + count) of x [rows, d], where
// count = min(kRowHadamardRows, rows - row0), into staged[c * (kRowHadamardRows + 1) + r] (row
// row0 + r, column c < d) as floats. load(i) returns element i of x as a float.
template <typename Load>
KY_HOST_DEVICE inline void StageRows(const HashDims& d, Load load, int64_t row0, int thread, int threads,
                                     float* staged) {
  const int64_t rows = d.batch * d.length;
  const int count = static_cast<int>(rows - row0 < kRowHadamardRows ? rows - row0 : kRowHadamardRows);
  const int dim = static_cast<int>(d.dim);
  const int64_t base = row0 * d.dim;
  for (int e = thread; e < count * dim; e += threads) {
    const int r = e / dim;
    const int c = e - r * dim;
    staged[c * (kRowHadamardRows + 1) + r] = load(base + e);
  }
}

// Step 3 for thread r: hashes row row0 + r (nothing when that is past the last row) from staged.
// signs [num_blocks, 3, P] (+-1, P = d.padded_dim); bit g = HadamardBitOfRow(d, q, t) < m * tau
// is bit g % tau of hash g / tau. lane_codes: the block's [m, kRowHadamardRows] int32, of which
// the thread uses its own column only. codes [B, m, N].
template <int P>
KY_HOST_DEVICE inline void HashStagedRow(const HashDims& d, const float* signs, const float* staged, int64_t row0,
                                         int r, int32_t* lane_codes, int32_t* codes) {
  const int64_t row = row0 + r;
  if (row >= d.batch * d.length) return;
  const int tau = static_cast<int>(d.hash_code_len);
  const int bits = static_cast<int>(d.num_hashes) * tau;
  const int dim = static_cast<int>(d.dim);
  int32_t* own = lane_codes + r;
  for (int h = 0; h < d.num_hashes; ++h) own[h * kRowHadamardRows] = 0;
  for (int q = 0; q < d.num_blocks; ++q) {
    const float* s = signs + q * 3 * P;
    double y[P];
    KY_ROWS_UNROLL for (int t = 0; t < P; ++t) {
      y[t] = static_cast<double>(t < dim ? staged[t * (kRowHadamardRows + 1) + r] : 0.0f) * s[t];
    }
    RegisterHadamard<P>(y);
    KY_ROWS_UNROLL for (int stage = 1; stage < 3; ++stage) {
      KY_ROWS_UNROLL for (int t = 0; t < P; ++t) y[t] *= s[stage * P + t];
      RegisterHadamard<P>(y);
    }
    KY_ROWS_UNROLL for (int t = 0; t < P; ++t) {
      const int g = static_cast<int>(HadamardBitOfRow(d, q, t));
      if (g < bits && y[t] > 0.0) own[(g / tau) * kRowHadamardRows] |= int32_t{1} << (g % tau);
    }
  }
  const int64_t b = row / d.length;
  const int64_t n = row - b * d.length;
  int32_t* out = codes + b * d.num_hashes * d.length + n;
  for (int h = 0; h < d.num_hashes; ++h) out[h * d.length] = own[h * kRowHadamardRows];
}

// True when the row form takes this call: d <= padded_dim <= kRowHadamardMaxPaddedDim and its
// block's shared memory fits `shared_limit` bytes; other calls take the block form.
KY_HOST_DEVICE inline bool UsesRowHadamard(const HashDims& d, int64_t shared_limit) {
  return d.dim <= d.padded_dim && d.padded_dim <= kRowHadamardMaxPaddedDim &&
         RowHadamardSharedBytes(d.padded_dim, d.num_hashes) <= shared_limit;
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_HADAMARD_ROWS_H_
