/* The C ABI of the keras-yoso CPU kernels: one entry that runs any primitive by name, no framework type.
 *
 * One entry, ky_run, runs every primitive of custom_ops/cc/kernels/yoso_primitives.h by name. It
 * takes tensors as KyTensor views (data pointer, dtype code, shape; row-major, contiguous), checks
 * them (ranks, sizes against each other, dtypes, attributes, codes in [0, num_buckets), the
 * per-bucket table limit) with the checks of custom_ops/cc/kernels/yoso_checks.h, then runs the
 * primitive's CPU kernel on the library's own thread pool with `num_threads` threads (<= 0: every
 * core). The caller allocates the outputs with the shapes the primitive documents; they are
 * checked too.
 *
 * Returns KY_OK, or KY_INVALID_ARGUMENT / KY_INTERNAL with the error text (NUL-terminated,
 * truncated to error_size bytes) in `error`. Thread-safe: any number of callers at once.
 *
 * Callers: keras_yoso/ops/providers/native_library.py (ctypes: the PyTorch provider), the XLA FFI
 * handlers of custom_ops/cc/jax/yoso_xla_ffi.cc (the JAX provider). The TensorFlow op kernels run
 * the same primitives (Check, then Run) on TensorFlow's own thread pool.
 */
#ifndef KERAS_YOSO_C_API_YOSO_C_API_H_
#define KERAS_YOSO_C_API_YOSO_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever an entry's signature or KyTensor changes; native_library.py checks it. */
#define KY_ABI_VERSION 6

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

/* One attribute of a primitive: int attributes read int_value, float attributes float_value. */
typedef struct KyAttribute {
  int64_t int_value;
  double float_value;
} KyAttribute;

/* Runs the primitive named `primitive` (custom_ops/cc/kernels/yoso_primitives.h lists them: their
 * inputs, attributes and outputs in order, shapes and equations; keras_yoso/ops/_spec.py is the
 * same table): `inputs` [num_inputs], `attributes` [num_attributes] and the caller-allocated
 * `outputs` [num_outputs], each in the primitive's order. Checks the counts, dtypes (masks,
 * tables and hash parameters float32; codes int32; the primitive's float inputs and outputs all
 * of one float dtype), shapes, attributes, codes in [0, num_buckets) and the outputs' shapes, then
 * runs the CPU kernel on `num_threads` threads of the library's pool. An output that the
 * primitive updates in place (the decoding step's tables_out) may be its input's tensor. */
KY_EXPORT int32_t ky_run(const char* primitive, const KyTensor* inputs, int32_t num_inputs,
                         const KyAttribute* attributes, int32_t num_attributes, KyTensor* outputs,
                         int32_t num_outputs, int32_t num_threads, char* error, int64_t error_size);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* KERAS_YOSO_C_API_YOSO_C_API_H_ */
