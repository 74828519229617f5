// Shapes, limits and the per-pair weight shared by the CPU and GPU kernels of
// keras-yoso. Plain C++ (also compiled by nvcc); no TensorFlow include.
//
// Notation (YOSO, Zeng et al. 2021): B = flattened batch (batch x heads),
// m = number of hashes, tau = bits per hash, Nq / Nk = number of queries / keys,
// D = value width, W = weight width, 2^tau = number of buckets.
#ifndef KERAS_YOSO_KERNELS_YOSO_COMMON_H_
#define KERAS_YOSO_KERNELS_YOSO_COMMON_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define KY_HOST_DEVICE __host__ __device__
#else
#define KY_HOST_DEVICE
#endif

namespace keras_yoso {

// Largest bucket count a cumulation accepts (tau <= 20).
constexpr int64_t kMaxNumBuckets = int64_t{1} << 20;
// Largest number of sign bits one hash code can hold in an int32.
constexpr int kMaxHashCodeLen = 30;
// Largest hash_code_len of the collision estimator (2^tau buckets <= kMaxNumBuckets).
constexpr int kMaxCollisionHashCodeLen = 20;
// Largest per-bucket table of a weighted LSH cumulation, in floats: W * D, the [W, D] K^T V
// table the CPU kernel builds for one bucket (1 GiB). The GPU kernel plans its global tables
// in blocks of weight and value columns within its own budget, so it needs no limit; the op
// wrappers reject larger W * D before allocating anything (CheckBucketTable of yoso_checks.h).
constexpr int64_t kMaxBucketTableFloats = int64_t{1} << 28;
// Largest padded_dim of the GPU Hadamard hash: one padded row of doubles per block lives in
// shared memory, and 8192 doubles (64 KiB) fit the opt-in shared memory of every target GPU
// (sm_75 and up).
constexpr int64_t kMaxGpuHadamardPaddedDim = 8192;
// Largest number of keys of the collision estimator: its sorted key indices are int32.
constexpr int64_t kMaxCollisionKeys = INT32_MAX;

// Size arithmetic in int64 for sizes >= 0, saturating at INT64_MAX instead of overflowing:
// exact whenever the true value fits, and >= INT64_MAX (so above every limit) otherwise.
KY_HOST_DEVICE constexpr int64_t SaturatingProduct(int64_t a, int64_t b) {
  return (a == 0 || b == 0) ? 0 : (a > INT64_MAX / b ? INT64_MAX : a * b);
}

// Elements of a [d0, d1, d2] tensor (0 when any dim is 0), saturated at INT64_MAX.
KY_HOST_DEVICE constexpr int64_t SaturatingElementCount(int64_t d0, int64_t d1, int64_t d2) {
  return (d0 == 0 || d1 == 0 || d2 == 0) ? 0 : SaturatingProduct(SaturatingProduct(d0, d1), d2);
}

// True when the weighted cumulation's per-bucket [weight_dim, value_dim] table fits
// kMaxBucketTableFloats.
KY_HOST_DEVICE constexpr bool BucketTableFits(int64_t weight_dim, int64_t value_dim) {
  return SaturatingProduct(weight_dim, value_dim) <= kMaxBucketTableFloats;
}

// True when `code` names one of the num_buckets buckets. The kernels skip other codes; the
// wrappers reject them first (InvalidCodesMessage of yoso_checks.h).
KY_HOST_DEVICE inline bool ValidCode(int32_t code, int64_t num_buckets) {
  return code >= 0 && code < num_buckets;
}

// Element type of the floating-point tensors handed to a GPU launcher.
// Every kernel accumulates in float32 whatever this type is.
enum class ScalarType { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Sizes of one hashing call: x [B, N, d] -> codes [B, m, N].
struct HashDims {
  int64_t batch;          // B
  int64_t length;         // N
  int64_t dim;            // d
  int64_t num_hashes;     // m
  int64_t hash_code_len;  // tau
  int64_t padded_dim;     // Hadamard only: next power of two >= d
  int64_t num_blocks;     // Hadamard only: the blocks of signs (see HadamardProjectionRow)
  bool interleaved = false;  // Hadamard only: the bit layout (see HadamardProjectionRow)
};

// Hadamard hash: the row q * padded_dim + r of the concatenated block projections
// [num_blocks * padded_dim] whose sign is bit k = h * tau + i of the codes (k < m * tau).
// Contiguous ("hadamard"): row k, so a hash's tau bits are neighbouring rows of one block,
// orthogonal directions whose signs are dependent. Interleaved ("hadamard_interleaved"):
// block k % num_blocks, row k / num_blocks, so with num_blocks >= tau the tau bits of a hash
// come from tau independent blocks and collide with probability (1 - theta/pi)^tau.
KY_HOST_DEVICE inline int64_t HadamardProjectionRow(const HashDims& d, int64_t k) {
  return d.interleaved ? (k % d.num_blocks) * d.padded_dim + k / d.num_blocks : k;
}

// The inverse of HadamardProjectionRow: the bit k of the projection row q * padded_dim + r
// (k >= m * tau: the row is not used).
KY_HOST_DEVICE inline int64_t HadamardBitOfRow(const HashDims& d, int64_t q, int64_t r) {
  return d.interleaved ? r * d.num_blocks + q : q * d.padded_dim + r;
}

// Sizes of one cumulation call. codes are [B, m, N]; masks [B, N] (keep where
// != 0); query_weight [B, Nq, W], key_weight [B, Nk, W]; value [B, Nk, D];
// output [B, Nq, D]. For the collision estimator, "query"/"key" vectors are
// [B, N, vector_dim] and the output is [B, Nq, vector_dim].
struct CumulationDims {
  int64_t batch;        // B
  int64_t num_hashes;   // m
  int64_t num_queries;  // Nq
  int64_t num_keys;     // Nk
  int64_t weight_dim;   // W (0 when unweighted)
  int64_t value_dim;    // D
  int64_t vector_dim;   // d (collision estimator only)
  int64_t num_buckets;  // 2^tau
};

// Weight of one colliding pair in the *YOSO estimator (appendix eq. 2):
//   tau (1 - acos(x)/pi)^(tau-1) / (pi sqrt(1 - x^2 + eps)),  x clipped to [-1, 1].
// The caller multiplies it by <dY_i, V_j>.
KY_HOST_DEVICE inline float CollisionDerivative(float x, int hash_code_len, float epsilon) {
  const float kPi = 3.14159265358979323846f;
  x = x > 1.0f ? 1.0f : (x < -1.0f ? -1.0f : x);
  const float p = 1.0f - acosf(x) / kPi;
  const float dp = hash_code_len == 1 ? 1.0f : powf(p, static_cast<float>(hash_code_len - 1));
  return static_cast<float>(hash_code_len) * dp / (kPi * sqrtf(1.0f - x * x + epsilon));
}

// True when hash h is the first hash in which query i and key j collide, so a
// pair that collides in several hashes is visited exactly once.
KY_HOST_DEVICE inline bool IsFirstCollision(const int32_t* query_codes, int64_t query_stride,
                                            const int32_t* key_codes, int64_t key_stride,
                                            int64_t h) {
  for (int64_t g = 0; g < h; ++g) {
    if (query_codes[g * query_stride] == key_codes[g * key_stride]) return false;
  }
  return true;
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_YOSO_COMMON_H_
