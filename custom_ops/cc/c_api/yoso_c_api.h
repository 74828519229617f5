/* The C ABI of the keras-yoso kernels: one entry per device that runs any primitive by name, no framework type.
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
 * ky_run_device runs the primitives that have a CUDA kernel (yoso_gpu_primitives.h lists them) the
 * same way on device tensors, on the caller's CUDA stream with a caller-allocated device workspace
 * (ky_device_workspace_bytes says how large). The library loads without CUDA: the CUDA runtime is
 * linked statically and opens the driver only when a GPU entry first runs.
 *
 * Callers: keras_yoso/ops/providers/native_library.py (ctypes: the PyTorch provider, CPU and CUDA),
 * the XLA FFI handlers of custom_ops/cc/jax/yoso_xla_ffi.cc (the JAX provider, CPU and CUDA). The
 * TensorFlow op kernels run the same primitives (Check, then Run or GpuRun<P>::Run) on TensorFlow's
 * own thread pool and streams.
 */
#ifndef KERAS_YOSO_C_API_YOSO_C_API_H_
#define KERAS_YOSO_C_API_YOSO_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever an entry's signature or KyTensor changes; native_library.py checks it. */
#define KY_ABI_VERSION 8

/* dtype codes; the float codes match keras_yoso::ScalarType. */
#define KY_FLOAT32 0
#define KY_FLOAT16 1
#define KY_BFLOAT16 2
#define KY_INT32 3

#define KY_OK 0
#define KY_INVALID_ARGUMENT 1
#define KY_INTERNAL 2

#define KY_MAX_RANK 8

/* The size of the error buffer the library's own callers pass (a message is truncated to it). */
#define KY_ERROR_SIZE 4096

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

/* How the library was built, for bug reports: the C++ compiler and, when it holds CUDA kernels, the
 * CUDA runtime version and the SM architectures (e.g. "compiler 12.2.0; CUDA runtime 13000 (static),
 * SM 80;90"). A static string. */
KY_EXPORT const char* ky_build_info(void);

/* 1 when the library holds CUDA kernels (built with nvcc), else 0. */
KY_EXPORT int32_t ky_device_kernels(void);

/* 1 when the primitive named `primitive` has a CUDA kernel in this library, else 0. */
KY_EXPORT int32_t ky_has_device_kernel(const char* primitive);

/* The device workspace, in bytes, that ky_run_device needs for this call of `primitive` (inputs and
 * attributes as for ky_run; the data pointers are not read). Checks the call as ky_run does (but the
 * codes' values) and the GPU kernel's own limits (e.g. causal = 0); writes *bytes. */
KY_EXPORT int32_t ky_device_workspace_bytes(const char* primitive, const KyTensor* inputs, int32_t num_inputs,
                                            const KyAttribute* attributes, int32_t num_attributes, int64_t* bytes,
                                            char* error, int64_t error_size);

/* ky_run on the GPU: `inputs` and `outputs` hold device pointers (of the current CUDA device), the
 * kernels are enqueued on `stream` (a cudaStream_t; NULL: the legacy default stream) and use the
 * caller's device `workspace` of at least ky_device_workspace_bytes bytes. Checks as ky_run does;
 * the codes are counted on the device, which synchronizes the stream once per codes input. Returns
 * KY_OK, KY_INVALID_ARGUMENT (a bad call, a primitive without a CUDA kernel, a limit of the CUDA
 * kernels) or KY_INTERNAL (a CUDA error, or a library built without CUDA kernels) with the message. */
KY_EXPORT int32_t ky_run_device(const char* primitive, const KyTensor* inputs, int32_t num_inputs,
                                const KyAttribute* attributes, int32_t num_attributes, KyTensor* outputs,
                                int32_t num_outputs, void* workspace, int64_t workspace_bytes, void* stream,
                                char* error, int64_t error_size);

/* ky_device_launch_plan's options, or'ed: exact IEEE fp32 products for fp32 rows (else TF32), and the
 * deterministic mode of the eq. 4 kernels. */
#define KY_PLAN_EXACT_FP32 1
#define KY_PLAN_DETERMINISTIC 2

/* The Triton launch plan (custom_ops/cc/kernels/triton_launch.h) of a call of `primitive` (inputs and
 * attributes as for ky_device_workspace_bytes; the data pointers are not read) for the cubins of compute
 * capability `arch` (80: 8.x, 90: 9.0) with `options` (KY_PLAN_*), written as NUL-terminated JSON into
 * `plan` (plan_size bytes): the workspace it
 * needs, the regions it zeroes, the kernels it launches in order with their grids and arguments. In every
 * build, with or without CUDA or cubins: tests run the plans in Triton's interpreter. Returns
 * KY_INVALID_ARGUMENT for a bad call, a primitive without Triton kernels or a call they cannot take, and
 * KY_ERROR_SIZE-like truncation as KY_INTERNAL when plan_size is too small. */
KY_EXPORT int32_t ky_device_launch_plan(const char* primitive, const KyTensor* inputs, int32_t num_inputs,
                                        const KyAttribute* attributes, int32_t num_attributes, int32_t arch,
                                        int32_t options, char* plan, int64_t plan_size, char* error,
                                        int64_t error_size);

/* The number of Triton cubins embedded in this library (0: built without KERAS_YOSO_TRITON_CUBINS). */
KY_EXPORT int32_t ky_triton_cubins(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* KERAS_YOSO_C_API_YOSO_C_API_H_ */
