// Input checks of the keras-yoso ops, written once for every framework.
//
// Each check returns an empty string when the input is fine, else the error text, built
// from the limits of yoso_common.h. The wrappers turn a non-empty text into their own error:
// tensorflow::errors::InvalidArgument (TF op kernels and shape functions), an XLA FFI
// InvalidArgument error (JAX), a C ABI error code plus text (keras_yoso/ops/providers/native_library.py raises
// ValueError). keras_yoso/_validation.py states the same limits for the composite, and
// tests/test_validation.py checks that the two agree.
//
// Plain C++ (no TensorFlow, XLA or torch include).
#ifndef KERAS_YOSO_KERNELS_YOSO_CHECKS_H_
#define KERAS_YOSO_KERNELS_YOSO_CHECKS_H_

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>

#include "yoso_common.h"

namespace keras_yoso {

// The shape of one input as the wrappers see it (rank <= kMaxCheckedRank; a wrapper
// rejects higher ranks with RankTooHighMessage before building one). Only TensorFlow's shape
// functions, which run while a graph is built, pass kUnknownDim for a dimension not known yet:
// the checks treat it as matching any size and skip the limits it takes part in (the kernel
// checks the real shapes when it runs). The kernels and the C ABI pass known sizes only (the C
// ABI rejects a negative one).
constexpr int kMaxCheckedRank = 8;
constexpr int64_t kUnknownDim = -1;
inline bool Known(int64_t dim) { return dim >= 0; }
struct Shape {
  int rank = 0;
  int64_t dims[kMaxCheckedRank] = {};
};

// "2**k" for a power of two 2^k, else the number: limits are written the way Python users
// pass them.
inline std::string PowerText(int64_t value) {
  int k = 0;
  while (k < 62 && (int64_t{1} << k) < value) ++k;
  return (int64_t{1} << k) == value && k >= 8 ? "2**" + std::to_string(k) : std::to_string(value);
}

// A float with 6 significant digits ("1e-06", "-1", "nan"), as absl::StrCat and so TensorFlow's
// messages print one.
inline std::string FloatText(float value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", static_cast<double>(value));
  return text;
}

// "[2,3,4]", as TensorFlow prints a shape (so messages read the same on every backend).
inline std::string ShapeText(const Shape& s) {
  std::string text = "[";
  for (int i = 0; i < s.rank; ++i) text += (i ? "," : "") + std::to_string(s.dims[i]);
  return text + "]";
}

inline std::string RankTooHighMessage(const char* name, int rank) {
  return std::string(name) + " has rank " + std::to_string(rank) + "; keras_yoso ops take at most " +
         std::to_string(kMaxCheckedRank);
}

// `t` has the rank of `want` and every dimension that is known in both `t` and `want`
// (kUnknownDim in `want`: any size).
inline std::string CheckShape(const Shape& t, const char* name, const char* meaning, const Shape& want) {
  bool ok = t.rank == want.rank;
  std::string text = "[";
  for (int axis = 0; axis < want.rank; ++axis) {
    const int64_t d = want.dims[axis];
    if (ok && Known(d) && Known(t.dims[axis]) && t.dims[axis] != d) ok = false;
    text += (axis ? ", " : "") + (d < 0 ? std::string("?") : std::to_string(d));
  }
  if (ok) return "";
  return std::string(name) + " must have shape " + meaning + " = " + text + "], got " + ShapeText(t);
}

inline std::string CheckShape(const Shape& t, const char* name, const char* meaning,
                              std::initializer_list<int64_t> dims) {
  Shape want;
  for (int64_t d : dims) want.dims[want.rank++] = d;
  return CheckShape(t, name, meaning, want);
}

inline std::string CheckNumBuckets(int64_t num_buckets) {
  if (num_buckets >= 1 && num_buckets <= kMaxNumBuckets && (num_buckets & (num_buckets - 1)) == 0) {
    return "";
  }
  return "num_buckets must be a power of two in [1, " + PowerText(kMaxNumBuckets) + "], got " +
         std::to_string(num_buckets);
}

// num_hashes >= 1 hashes of hash_code_len in [1, kMaxHashCodeLen] bits.
inline std::string CheckHashAttrs(int64_t num_hashes, int64_t hash_code_len) {
  if (num_hashes < 1) return "num_hashes must be >= 1, got " + std::to_string(num_hashes);
  if (hash_code_len < 1 || hash_code_len > kMaxHashCodeLen) {
    return "hash_code_len must be in [1, " + std::to_string(kMaxHashCodeLen) +
           "] (int32 codes), got " + std::to_string(hash_code_len);
  }
  if (SaturatingProduct(num_hashes, hash_code_len) == INT64_MAX) {
    return "num_hashes * hash_code_len must fit in int64, got num_hashes = " +
           std::to_string(num_hashes) + " and hash_code_len = " + std::to_string(hash_code_len);
  }
  return "";
}

inline std::string CheckCollisionAttrs(int64_t hash_code_len, float epsilon) {
  if (hash_code_len < 1 || hash_code_len > kMaxCollisionHashCodeLen) {
    return "hash_code_len must be in [1, " + std::to_string(kMaxCollisionHashCodeLen) + "], got " +
           std::to_string(hash_code_len);
  }
  if (!(epsilon >= 0.0f)) return "epsilon must be >= 0, got " + FloatText(epsilon);
  return "";
}

// The weighted cumulation's per-bucket [weight_dim, value_dim] table fits kMaxBucketTableFloats.
inline std::string CheckBucketTable(int64_t weight_dim, int64_t value_dim) {
  if (!Known(weight_dim) || !Known(value_dim) || BucketTableFits(weight_dim, value_dim)) return "";
  return "the per-bucket table of the weighted LSH cumulation, weight_dim * value_dim = " +
         std::to_string(weight_dim) + " * " + std::to_string(value_dim) +
         " floats (weight_dim: axis 2 of query_weight and key_weight; value_dim: axis 2 of "
         "value), exceeds the limit of " + PowerText(kMaxBucketTableFloats) + " floats (" +
         std::to_string(kMaxBucketTableFloats * 4 >> 30) +
         " GiB); split weight_dim or value_dim into chunks";
}

// The direction attribute of the LSH cumulations: 0 every key, 1 keys j <= i (causal),
// -1 keys j >= i (anti-causal, the transposed cumulations of a causal backward).
inline std::string CheckCausalAttr(int64_t causal) {
  if (causal >= -1 && causal <= 1) return "";
  return "causal must be -1, 0 or 1, got " + std::to_string(causal);
}

// With causal != 0, query i and key i are the same position: Nq == Nk.
inline std::string CheckCausalLengths(int64_t causal, int64_t num_queries, int64_t num_keys) {
  if (causal == 0 || !Known(num_queries) || !Known(num_keys) || num_queries == num_keys) return "";
  return "causal = " + std::to_string(causal) +
         " needs as many queries as keys (query i and key i are position i), got num_queries = " +
         std::to_string(num_queries) + " and num_keys = " + std::to_string(num_keys);
}

// `invalid` codes of input `name` lie outside [0, num_buckets).
inline std::string InvalidCodesMessage(const char* name, int64_t invalid, int64_t num_buckets) {
  if (invalid == 0) return "";
  return std::string(name) + " has " + std::to_string(invalid) +
         " codes outside [0, num_buckets) = [0, " + std::to_string(num_buckets) + ")";
}

inline std::string CheckGpuHadamardPaddedDim(int64_t padded_dim) {
  if (padded_dim <= kMaxGpuHadamardPaddedDim) return "";
  return "signs has padded_dim = " + std::to_string(padded_dim) +
         " (axis 2), more than the GPU Hadamard hash supports (" +
         std::to_string(kMaxGpuHadamardPaddedDim) +
         ": a padded row of x must fit in shared memory); use method=\"gaussian\", "
         "implementation=\"composite\" or the CPU";
}

// x [B, N, d] and the Gaussian projection [d, m * tau]; fills d.
inline std::string CheckGaussianHash(const Shape& x, const Shape& projection, int64_t num_hashes,
                                     int64_t hash_code_len, HashDims* d) {
  std::string error = CheckHashAttrs(num_hashes, hash_code_len);
  if (error.empty()) error = CheckShape(x, "x", "[batch, length, dim]", {-1, -1, -1});
  if (!error.empty()) return error;
  *d = HashDims{x.dims[0], x.dims[1], x.dims[2], num_hashes, hash_code_len, 0, 0};
  return CheckShape(projection, "projection", "[dim, num_hashes * hash_code_len]",
                    {d->dim, num_hashes * hash_code_len});
}

// x [B, N, d] and the Hadamard signs [num_blocks, 3, padded_dim]; fills d (interleaved: the bit
// layout, HadamardProjectionRow).
inline std::string CheckHadamardHash(const Shape& x, const Shape& signs, int64_t num_hashes,
                                     int64_t hash_code_len, bool interleaved, HashDims* d) {
  std::string error = CheckHashAttrs(num_hashes, hash_code_len);
  if (error.empty()) error = CheckShape(x, "x", "[batch, length, dim]", {-1, -1, -1});
  if (error.empty()) error = CheckShape(signs, "signs", "[num_blocks, 3, padded_dim]", {-1, 3, -1});
  if (!error.empty()) return error;
  const int64_t bits = num_hashes * hash_code_len;
  *d = HashDims{x.dims[0], x.dims[1], x.dims[2], num_hashes, hash_code_len, signs.dims[2],
                signs.dims[0], interleaved};
  if (!Known(d->dim) || !Known(d->padded_dim) || !Known(d->num_blocks)) return "";
  if (d->padded_dim >= 1 && (d->padded_dim & (d->padded_dim - 1)) == 0 &&
      d->padded_dim >= d->dim && SaturatingProduct(d->num_blocks, d->padded_dim) >= bits) {
    return "";
  }
  return "signs must have shape [num_blocks, 3, padded_dim] with padded_dim a power of two >= dim (" +
         std::to_string(d->dim) + ") and num_blocks * padded_dim >= num_hashes * hash_code_len (" +
         std::to_string(bits) + "), got " + ShapeText(signs);
}

// Codes [B, m, N] and masks [B, N] of both sides, checked against each other; fills the
// batch, num_hashes, num_queries and num_keys of d.
inline std::string CheckCumulationSides(const Shape& query_mask, const Shape& query_codes,
                                        const Shape& key_mask, const Shape& key_codes,
                                        CumulationDims* d) {
  std::string error = CheckShape(query_codes, "query_codes", "[batch, num_hashes, num_queries]",
                                 {-1, -1, -1});
  if (!error.empty()) return error;
  d->batch = query_codes.dims[0];
  d->num_hashes = query_codes.dims[1];
  d->num_queries = query_codes.dims[2];
  if (d->num_hashes == 0) {
    return "query_codes must have num_hashes >= 1 (axis 1), got shape " + ShapeText(query_codes);
  }
  error = CheckShape(key_codes, "key_codes", "[batch, num_hashes, num_keys]",
                     {d->batch, d->num_hashes, -1});
  if (!error.empty()) return error;
  d->num_keys = key_codes.dims[2];
  error = CheckShape(query_mask, "query_mask", "[batch, num_queries]", {d->batch, d->num_queries});
  if (!error.empty()) return error;
  return CheckShape(key_mask, "key_mask", "[batch, num_keys]", {d->batch, d->num_keys});
}

// lsh_cumulation: value [B, Nk, D], causal in {-1, 0, 1} (Nq == Nk unless 0); fills d
// (num_buckets included).
inline std::string CheckLshCumulation(const Shape& query_mask, const Shape& query_codes,
                                      const Shape& key_mask, const Shape& key_codes,
                                      const Shape& value, int64_t num_buckets, CumulationDims* d,
                                      int64_t causal = 0) {
  *d = CumulationDims{};
  d->num_buckets = num_buckets;
  std::string error = CheckNumBuckets(num_buckets);
  if (error.empty()) error = CheckCausalAttr(causal);
  if (error.empty()) error = CheckCumulationSides(query_mask, query_codes, key_mask, key_codes, d);
  if (error.empty()) error = CheckCausalLengths(causal, d->num_queries, d->num_keys);
  if (error.empty()) {
    error = CheckShape(value, "value", "[batch, num_keys, value_dim]", {d->batch, d->num_keys, -1});
  }
  if (error.empty()) d->value_dim = value.dims[2];
  return error;
}

// lsh_cumulation_step (decoding): T new positions on both sides (query_codes and key_codes
// [B, m, T], masks [B, T]), value [B, T, D] and the bucket tables of the earlier positions
// [B, m, num_buckets, D]; fills d (num_buckets from the tables, a power of two <= 2^20).
inline std::string CheckLshCumulationStep(const Shape& query_mask, const Shape& query_codes,
                                          const Shape& key_mask, const Shape& key_codes,
                                          const Shape& value, const Shape& tables,
                                          CumulationDims* d) {
  *d = CumulationDims{};
  std::string error = CheckCumulationSides(query_mask, query_codes, key_mask, key_codes, d);
  if (error.empty()) error = CheckCausalLengths(1, d->num_queries, d->num_keys);
  if (error.empty()) {
    error = CheckShape(value, "value", "[batch, num_keys, value_dim]", {d->batch, d->num_keys, -1});
  }
  if (!error.empty()) return error;
  d->value_dim = value.dims[2];
  error = CheckShape(tables, "tables", "[batch, num_hashes, num_buckets, value_dim]",
                     {d->batch, d->num_hashes, -1, d->value_dim});
  if (!error.empty()) return error;
  d->num_buckets = tables.dims[2];
  return Known(d->num_buckets) ? CheckNumBuckets(d->num_buckets) : "";
}

// query_weight [B, Nq, W] and key_weight [B, Nk, W] against the sides in d; *width = W.
inline std::string CheckWeightPair(const Shape& query_weight, const Shape& key_weight,
                                   const CumulationDims& d, int64_t* width) {
  std::string error = CheckShape(query_weight, "query_weight", "[batch, num_queries, weight_dim]",
                                 {d.batch, d.num_queries, -1});
  if (!error.empty()) return error;
  *width = query_weight.dims[2];
  return CheckShape(key_weight, "key_weight", "[batch, num_keys, weight_dim]",
                    {d.batch, d.num_keys, *width});
}

// weighted_lsh_cumulation: query_weight [B, Nq, W], key_weight [B, Nk, W], value [B, Nk, D],
// the per-bucket table W * D within its limit, causal as in CheckLshCumulation; fills d.
inline std::string CheckWeightedLshCumulation(const Shape& query_mask, const Shape& query_codes,
                                              const Shape& query_weight, const Shape& key_mask,
                                              const Shape& key_codes, const Shape& key_weight,
                                              const Shape& value, int64_t num_buckets,
                                              CumulationDims* d, int64_t causal = 0) {
  std::string error = CheckLshCumulation(query_mask, query_codes, key_mask, key_codes, value,
                                         num_buckets, d, causal);
  if (error.empty()) error = CheckWeightPair(query_weight, key_weight, *d, &d->weight_dim);
  return error.empty() ? CheckBucketTable(d->weight_dim, d->value_dim) : error;
}

// lower_bound_gradients: query [B, Nq, d], key [B, Nk, d], value [B, Nk, D], output_gradient
// [B, Nq, D], the per-bucket table D * d within its limit, causal as in CheckLshCumulation; fills d
// (d.value_dim = D, d.vector_dim = d: the outputs are [B, Nq, d] and [B, Nk, d]).
inline std::string CheckLowerBoundGradients(const Shape& query_mask, const Shape& query_codes,
                                            const Shape& query, const Shape& key_mask,
                                            const Shape& key_codes, const Shape& key,
                                            const Shape& value, const Shape& output_gradient,
                                            int64_t num_buckets, CumulationDims* d, int64_t causal) {
  std::string error = CheckLshCumulation(query_mask, query_codes, key_mask, key_codes, value,
                                         num_buckets, d, causal);
  if (!error.empty()) return error;
  error = CheckShape(output_gradient, "output_gradient", "[batch, num_queries, value_dim]",
                     {d->batch, d->num_queries, d->value_dim});
  if (error.empty()) error = CheckShape(query, "query", "[batch, num_queries, dim]", {d->batch, d->num_queries, -1});
  if (!error.empty()) return error;
  d->vector_dim = query.dims[2];
  error = CheckShape(key, "key", "[batch, num_keys, dim]", {d->batch, d->num_keys, d->vector_dim});
  return error.empty() ? CheckBucketTable(d->value_dim, d->vector_dim) : error;
}

// collision_cumulation: query [B, Nq, d], query_weight [B, Nq, W], key [B, Nk, d],
// key_weight [B, Nk, W]; fills d (d.vector_dim = d, d.weight_dim = W: the output is [B, Nq, d]).
inline std::string CheckCollisionCumulation(const Shape& query_mask, const Shape& query_codes,
                                            const Shape& query, const Shape& query_weight,
                                            const Shape& key_mask, const Shape& key_codes,
                                            const Shape& key, const Shape& key_weight,
                                            int64_t hash_code_len, float epsilon,
                                            CumulationDims* d) {
  *d = CumulationDims{};
  std::string error = CheckCollisionAttrs(hash_code_len, epsilon);
  if (!error.empty()) return error;
  d->num_buckets = int64_t{1} << hash_code_len;
  error = CheckCumulationSides(query_mask, query_codes, key_mask, key_codes, d);
  if (error.empty()) {
    error = CheckShape(query, "query", "[batch, num_queries, dim]", {d->batch, d->num_queries, -1});
  }
  if (!error.empty()) return error;
  d->vector_dim = query.dims[2];
  error = CheckShape(key, "key", "[batch, num_keys, dim]", {d->batch, d->num_keys, d->vector_dim});
  if (error.empty()) error = CheckWeightPair(query_weight, key_weight, *d, &d->weight_dim);
  if (!error.empty()) return error;
  if (d->num_keys > kMaxCollisionKeys) {
    return "key_codes must have num_keys <= " + PowerText(kMaxCollisionKeys + 1) +
           " - 1 (axis 2; the collision estimator sorts int32 key indices), got " +
           std::to_string(d->num_keys);
  }
  return "";
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_YOSO_CHECKS_H_
