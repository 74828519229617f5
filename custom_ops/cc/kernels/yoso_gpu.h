// CUDA launchers of the keras-yoso kernels: raw device pointers, sizes and a
// cudaStream_t. No TensorFlow include: the TF op wrappers
// (custom_ops/cc/tf/yoso_kernels.cc) and the standalone GPU harness (tests/gpu/) both call these.
//
// Conventions shared by every launcher:
// - Tensors are dense, row-major, on the device. Floating-point tensors whose
//   type is `dtype` are passed as void*; masks are float32 ([B, N], keep where
//   != 0); codes are int32 [B, m, N].
// - Accumulation is float32 whatever `dtype` is; outputs are written in `dtype`.
// - A launcher that needs scratch memory has a companion *WorkspaceBytes(dims)
//   function; the caller allocates at least that many bytes on the device and
//   passes them as `workspace`. Launchers never allocate.
// - Codes outside [0, num_buckets) are skipped by every kernel (never read or
//   written out of bounds); wrappers reject them first with CountInvalidCodesGpu.
// - Launchers only enqueue work on `stream` and return the launch status.
#ifndef KERAS_YOSO_KERNELS_YOSO_GPU_H_
#define KERAS_YOSO_KERNELS_YOSO_GPU_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "yoso_common.h"

namespace keras_yoso {

// Writes into *device_count (one unsigned 64-bit integer on the device) the number of codes
// outside [0, num_buckets) among `count` codes.
cudaError_t CountInvalidCodesGpu(const int32_t* codes, int64_t count, int64_t num_buckets,
                                 unsigned long long* device_count, cudaStream_t stream);

// Hyperplane LSH with a dense Gaussian projection (appendix §1.2, F(x) = sign(Px)):
// codes[b, h, n] = sum_i [<x[b, n, :], projection[:, h * tau + i]> > 0] << i.
// x [B, N, d] (dtype), projection [d, m * tau] float32.
cudaError_t GaussianHashCodesGpu(const HashDims& dims, ScalarType dtype, const void* x,
                                 const float* projection, int32_t* codes, cudaStream_t stream);

// Hyperplane LSH with the fast Hadamard approximation (appendix §1.2):
// for block q, y_q = H D3 H D2 H D1 pad(x) with H the unnormalized Hadamard
// matrix of size padded_dim and D_p = diag(signs[q, p - 1, :]); bit g of the
// concatenated sign vector [y_0 > 0, y_1 > 0, ...] is bit g % tau of hash g / tau.
// x [B, N, d] (dtype), signs [num_blocks, 3, padded_dim] float32 (+-1). The
// transform runs in double: in registers, one thread per row for padded_dim <= 64 and
// padded_dim / 64 lanes per row up to 256 (hadamard_rows.h, when m's code words fit the
// block's shared memory); otherwise in
// shared memory, one block per row and block of signs (padded_dim * 8 bytes), so
// padded_dim is limited by the device's opt-in shared memory: kMaxGpuHadamardPaddedDim
// (8192) fits every target GPU, and the TF op rejects more; beyond the device's limit
// the launcher returns the CUDA error.
cudaError_t HadamardHashCodesGpu(const HashDims& dims, ScalarType dtype, const void* x,
                                 const float* signs, int32_t* codes, cudaStream_t stream);

// LSH cumulation (YOSO eq. 2, averaged over m hashes):
// out[b, i] = qmask[b, i] / m * sum_h sum_j kmask[b, j] [qc[b,h,i] == kc[b,h,j]] value[b, j].
// value [B, Nk, D] and out [B, Nq, D] in dtype.
size_t LshCumulationWorkspaceBytes(const CumulationDims& dims);
cudaError_t LshCumulationGpu(const CumulationDims& dims, ScalarType dtype,
                             const float* query_mask, const int32_t* query_codes,
                             const float* key_mask, const int32_t* key_codes, const void* value,
                             void* out, void* workspace, size_t workspace_bytes,
                             cudaStream_t stream);

// Weighted LSH cumulation: the pair (i, j) of LshCumulationGpu is weighted by
// <query_weight[b, i], key_weight[b, j]>. query_weight [B, Nq, W], key_weight
// [B, Nk, W], value [B, Nk, D], out [B, Nq, D], all in dtype.
size_t WeightedLshCumulationWorkspaceBytes(const CumulationDims& dims);
cudaError_t WeightedLshCumulationGpu(const CumulationDims& dims, ScalarType dtype,
                                     const float* query_mask, const int32_t* query_codes,
                                     const void* query_weight, const float* key_mask,
                                     const int32_t* key_codes, const void* key_weight,
                                     const void* value, void* out, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream);

// Collision estimator of the YOSO-E gradient (*YOSO, appendix eq. 2 restricted
// to colliding pairs): over pairs (i, j) with qmask[b,i] != 0, kmask[b,j] != 0
// that collide in at least one of the m hashes (each such pair counted once),
//   out[b, i] = sum_j <query_weight[b,i], key_weight[b,j]>
//               * CollisionDerivative(<query[b,i], key[b,j]>, tau, epsilon) * key[b, j].
// query [B, Nq, d], key [B, Nk, d], query_weight [B, Nq, D], key_weight [B, Nk, D],
// out [B, Nq, d], all in dtype. Cost O(nnz * (m + d + D)).
size_t CollisionCumulationWorkspaceBytes(const CumulationDims& dims);
cudaError_t CollisionCumulationGpu(const CumulationDims& dims, ScalarType dtype,
                                   int hash_code_len, float epsilon, const float* query_mask,
                                   const int32_t* query_codes, const void* query,
                                   const void* query_weight, const float* key_mask,
                                   const int32_t* key_codes, const void* key,
                                   const void* key_weight, void* out, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream);

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_YOSO_GPU_H_
