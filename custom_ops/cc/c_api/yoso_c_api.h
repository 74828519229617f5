/* The C ABI of the keras-yoso CPU kernels: one entry per op, no framework type.
 *
 * Every entry takes its tensors as KyTensor views (data pointer, dtype code, shape; row-major,
 * contiguous), checks them (ranks, sizes against each other, dtypes, attributes, codes in
 * [0, num_buckets), the per-bucket table limit) with the checks of
 * custom_ops/cc/kernels/yoso_checks.h, then runs the algorithm of yoso_cpu.h on the library's
 * own thread pool with `num_threads` threads (<= 0: every core). The caller allocates the
 * output with the shape the op documents; it is checked too.
 *
 * Returns KY_OK, or KY_INVALID_ARGUMENT / KY_INTERNAL with the error text (NUL-terminated,
 * truncated to error_size bytes) in `error`. Thread-safe: any number of callers at once.
 *
 * Callers: keras_yoso/ops/providers/native_library.py (ctypes: the PyTorch provider), the XLA FFI
 * handlers of custom_ops/cc/jax/yoso_xla_ffi.cc (the JAX provider). The TensorFlow op kernels call the same
 * checks and algorithms on TensorFlow's own thread pool.
 */
#ifndef KERAS_YOSO_C_API_YOSO_C_API_H_
#define KERAS_YOSO_C_API_YOSO_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever an entry's signature or KyTensor changes; native_library.py checks it. */
#define KY_ABI_VERSION 5

/* dtype codes; the float codes match keras_yoso::ScalarType. */
#define KY_FLOAT32 0
#define KY_FLOAT16 1
#define KY_BFLOAT16 2
#define KY_INT32 3

#define KY_OK 0
#define KY_INVALID_ARGUMENT 1
#define KY_INTERNAL 2

#define KY_MAX_RANK 8

/* The library is built with -fvisibility=hidden: only the entries below are exported. */
#if defined(__GNUC__) || defined(__clang__)
#define KY_EXPORT __attribute__((visibility("default")))
#else
#define KY_EXPORT
#endif

typedef struct KyTensor {
  void* data;
  int32_t dtype;
  int32_t rank;
  int64_t dims[KY_MAX_RANK];
} KyTensor;

KY_EXPORT int32_t ky_abi_version(void);

/* The signature of libgomp's GOMP_parallel (what `#pragma omp parallel` compiles to). */
typedef void (*KyParallelRegion)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);

/* Process-wide, once: makes the libgomp whose GOMP_parallel is `parallel_region` throttle the
 * spinning of its idle workers (about 100 spins before they sleep instead of about 300,000), by
 * holding one parallel region of `num_threads` sleeping threads on it (openmp_spinning.h says
 * why). The PyTorch provider calls it with PyTorch's libgomp and the CPUs the process may use
 * (keras_yoso/ops/providers/torch.py). Returns 1 when this call opened the region, else 0. */
KY_EXPORT int32_t ky_throttle_openmp_spinning(KyParallelRegion parallel_region, int32_t num_threads);

/* x [B, N, d] (float), projection float32 [d, m * tau] -> codes int32 [B, m, N]. */
KY_EXPORT int32_t ky_gaussian_hash_codes(const KyTensor* x, const KyTensor* projection, int64_t num_hashes,
                               int64_t hash_code_len, KyTensor* codes, int32_t num_threads,
                               char* error, int64_t error_size);

/* x [B, N, d] (float), signs float32 [num_blocks, 3, padded_dim] -> codes int32 [B, m, N].
 * Bit i of hash h is the sign of row h * tau + i of the concatenated block projections
 * (contiguous: a hash's bits are neighbouring rows of one block; the "hadamard" method). */
KY_EXPORT int32_t ky_hadamard_hash_codes(const KyTensor* x, const KyTensor* signs, int64_t num_hashes,
                               int64_t hash_code_len, KyTensor* codes, int32_t num_threads,
                               char* error, int64_t error_size);

/* As ky_hadamard_hash_codes, with bit k = h * tau + i the sign of row k / num_blocks of block
 * k % num_blocks (interleaved: with num_blocks >= tau a hash's bits come from independent
 * blocks; the "hadamard_interleaved" method, yoso_common.h HadamardProjectionRow). */
KY_EXPORT int32_t ky_hadamard_interleaved_hash_codes(const KyTensor* x, const KyTensor* signs,
                               int64_t num_hashes, int64_t hash_code_len, KyTensor* codes,
                               int32_t num_threads, char* error, int64_t error_size);

/* masks float32 [B, N], codes int32 [B, m, N], value [B, Nk, D] -> output [B, Nq, D]
 * (value's dtype). YOSO eq. 2 averaged over the m hashes. causal: 0 every key; 1 keys j <= i;
 * -1 keys j >= i (causal != 0 needs Nq == Nk: query i and key i are position i). */
KY_EXPORT int32_t ky_lsh_cumulation(const KyTensor* query_mask, const KyTensor* query_codes,
                          const KyTensor* key_mask, const KyTensor* key_codes,
                          const KyTensor* value, int64_t num_buckets, int64_t causal,
                          KyTensor* output, int32_t num_threads, char* error, int64_t error_size);

/* Decoding step of causal YOSO: masks float32 [B, T], codes int32 [B, m, T] of T new positions,
 * value [B, T, D], tables float32 [B, m, num_buckets, D] (the bucket sums of the earlier positions'
 * values) -> output [B, T, D] (value's dtype): query t over the earlier positions and the new keys
 * j <= t; tables_out float32 [B, m, num_buckets, D]: the tables with the new keys added. tables_out
 * may be the tables tensor itself (updated in place). */
KY_EXPORT int32_t ky_lsh_cumulation_step(const KyTensor* query_mask, const KyTensor* query_codes,
                               const KyTensor* key_mask, const KyTensor* key_codes,
                               const KyTensor* value, const KyTensor* tables, KyTensor* output,
                               KyTensor* tables_out, int32_t num_threads, char* error,
                               int64_t error_size);

/* query_weight [B, Nq, W], key_weight [B, Nk, W], value [B, Nk, D] -> output [B, Nq, D]:
 * lsh_cumulation with each pair weighted by <query_weight_i, key_weight_j> (eq. 4's blocks);
 * causal as in ky_lsh_cumulation. */
KY_EXPORT int32_t ky_weighted_lsh_cumulation(const KyTensor* query_mask, const KyTensor* query_codes,
                                   const KyTensor* query_weight, const KyTensor* key_mask,
                                   const KyTensor* key_codes, const KyTensor* key_weight,
                                   const KyTensor* value, int64_t num_buckets, int64_t causal,
                                   KyTensor* output, int32_t num_threads, char* error,
                                   int64_t error_size);

/* query [B, Nq, d], query_weight [B, Nq, W], key [B, Nk, d], key_weight [B, Nk, W]
 * -> output [B, Nq, d]: the *YOSO collision estimator (appendix eq. 2 on colliding pairs). */
KY_EXPORT int32_t ky_collision_cumulation(const KyTensor* query_mask, const KyTensor* query_codes,
                                const KyTensor* query, const KyTensor* query_weight,
                                const KyTensor* key_mask, const KyTensor* key_codes,
                                const KyTensor* key, const KyTensor* key_weight,
                                int64_t hash_code_len, float epsilon, KyTensor* output,
                                int32_t num_threads, char* error, int64_t error_size);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* KERAS_YOSO_C_API_YOSO_C_API_H_ */
