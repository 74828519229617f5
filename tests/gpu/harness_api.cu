// extern "C" shims over the launchers of yoso_gpu.h, for ctypes: sizes are
// plain int64 arguments, tensors are raw device pointers, dtype is the integer
// value of keras_yoso::ScalarType (0 float32, 1 float16, 2 bfloat16), stream is
// a cudaStream_t handle (0 for the legacy default stream). Every function
// returns the cudaError_t of its launcher as an int (0 = cudaSuccess).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "yoso_gpu.h"

namespace {

using keras_yoso::CumulationDims;
using keras_yoso::HashDims;
using keras_yoso::ScalarType;

CumulationDims MakeCumulationDims(int64_t batch, int64_t num_hashes, int64_t num_queries,
                                  int64_t num_keys, int64_t weight_dim, int64_t value_dim,
                                  int64_t vector_dim, int64_t num_buckets) {
  return CumulationDims{batch,      num_hashes, num_queries, num_keys,
                        weight_dim, value_dim,  vector_dim,  num_buckets};
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

extern "C" {

int yoso_count_invalid_codes(const int32_t* codes, int64_t count, int64_t num_buckets,
                             unsigned long long* device_count, void* stream) {
  return keras_yoso::CountInvalidCodesGpu(codes, count, num_buckets, device_count,
                                          AsStream(stream));
}

int yoso_gaussian_hash_codes(int64_t batch, int64_t length, int64_t dim, int64_t num_hashes,
                             int64_t hash_code_len, int dtype, const void* x,
                             const float* projection, int32_t* codes, void* stream) {
  const HashDims dims{batch, length, dim, num_hashes, hash_code_len, 0, 0};
  return keras_yoso::GaussianHashCodesGpu(dims, static_cast<ScalarType>(dtype), x, projection,
                                          codes, AsStream(stream));
}

int yoso_hadamard_hash_codes(int64_t batch, int64_t length, int64_t dim, int64_t num_hashes,
                             int64_t hash_code_len, int64_t padded_dim, int64_t num_blocks,
                             int dtype, const void* x, const float* signs, int32_t* codes,
                             void* stream) {
  const HashDims dims{batch, length, dim, num_hashes, hash_code_len, padded_dim, num_blocks};
  return keras_yoso::HadamardHashCodesGpu(dims, static_cast<ScalarType>(dtype), x, signs, codes,
                                          AsStream(stream));
}

uint64_t yoso_lsh_cumulation_workspace_bytes(int64_t batch, int64_t num_hashes,
                                             int64_t num_queries, int64_t num_keys,
                                             int64_t weight_dim, int64_t value_dim,
                                             int64_t vector_dim, int64_t num_buckets) {
  return keras_yoso::LshCumulationWorkspaceBytes(MakeCumulationDims(
      batch, num_hashes, num_queries, num_keys, weight_dim, value_dim, vector_dim, num_buckets));
}

int yoso_lsh_cumulation(int64_t batch, int64_t num_hashes, int64_t num_queries, int64_t num_keys,
                        int64_t weight_dim, int64_t value_dim, int64_t vector_dim,
                        int64_t num_buckets, int dtype, const float* query_mask,
                        const int32_t* query_codes, const float* key_mask,
                        const int32_t* key_codes, const void* value, void* out, void* workspace,
                        uint64_t workspace_bytes, void* stream) {
  return keras_yoso::LshCumulationGpu(
      MakeCumulationDims(batch, num_hashes, num_queries, num_keys, weight_dim, value_dim,
                         vector_dim, num_buckets),
      static_cast<ScalarType>(dtype), query_mask, query_codes, key_mask, key_codes, value, out,
      workspace, static_cast<size_t>(workspace_bytes), AsStream(stream));
}

uint64_t yoso_weighted_lsh_cumulation_workspace_bytes(int64_t batch, int64_t num_hashes,
                                                      int64_t num_queries, int64_t num_keys,
                                                      int64_t weight_dim, int64_t value_dim,
                                                      int64_t vector_dim, int64_t num_buckets) {
  return keras_yoso::WeightedLshCumulationWorkspaceBytes(MakeCumulationDims(
      batch, num_hashes, num_queries, num_keys, weight_dim, value_dim, vector_dim, num_buckets));
}

int yoso_weighted_lsh_cumulation(int64_t batch, int64_t num_hashes, int64_t num_queries,
                                 int64_t num_keys, int64_t weight_dim, int64_t value_dim,
                                 int64_t vector_dim, int64_t num_buckets, int dtype,
                                 const float* query_mask, const int32_t* query_codes,
                                 const void* query_weight, const float* key_mask,
                                 const int32_t* key_codes, const void* key_weight,
                                 const void* value, void* out, void* workspace,
                                 uint64_t workspace_bytes, void* stream) {
  return keras_yoso::WeightedLshCumulationGpu(
      MakeCumulationDims(batch, num_hashes, num_queries, num_keys, weight_dim, value_dim,
                         vector_dim, num_buckets),
      static_cast<ScalarType>(dtype), query_mask, query_codes, query_weight, key_mask, key_codes,
      key_weight, value, out, workspace, static_cast<size_t>(workspace_bytes), AsStream(stream));
}

uint64_t yoso_collision_cumulation_workspace_bytes(int64_t batch, int64_t num_hashes,
                                                   int64_t num_queries, int64_t num_keys,
                                                   int64_t weight_dim, int64_t value_dim,
                                                   int64_t vector_dim, int64_t num_buckets) {
  return keras_yoso::CollisionCumulationWorkspaceBytes(MakeCumulationDims(
      batch, num_hashes, num_queries, num_keys, weight_dim, value_dim, vector_dim, num_buckets));
}

int yoso_collision_cumulation(int64_t batch, int64_t num_hashes, int64_t num_queries,
                              int64_t num_keys, int64_t weight_dim, int64_t value_dim,
                              int64_t vector_dim, int64_t num_buckets, int dtype,
                              int hash_code_len, float epsilon, const float* query_mask,
                              const int32_t* query_codes, const void* query,
                              const void* query_weight, const float* key_mask,
                              const int32_t* key_codes, const void* key, const void* key_weight,
                              void* out, void* workspace, uint64_t workspace_bytes,
                              void* stream) {
  return keras_yoso::CollisionCumulationGpu(
      MakeCumulationDims(batch, num_hashes, num_queries, num_keys, weight_dim, value_dim,
                         vector_dim, num_buckets),
      static_cast<ScalarType>(dtype), hash_code_len, epsilon, query_mask, query_codes, query,
      query_weight, key_mask, key_codes, key, key_weight, out, workspace,
      static_cast<size_t>(workspace_bytes), AsStream(stream));
}

}  // extern "C"
