// CUDA kernels and launchers of keras-yoso, declared in yoso_gpu.h.
// No TensorFlow include: the TF op wrappers and the standalone harness in
// tests/gpu/ both link this file.
//
// Every kernel runs a grid-stride loop with int64 indices, so any tensor size
// is covered by a grid capped at kMaxBlocks; every launch is skipped when it
// has no work (a grid of 0 blocks is a CUDA error). Sums are float32; element
// type conversions happen only at loads (ToFloat) and stores (FromFloat).
#include "yoso_gpu.h"

#include "hadamard_rows.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <cub/device/device_segmented_radix_sort.cuh>

namespace keras_yoso {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kWarpSize = 32;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
// Every scratch region starts at a multiple of this many bytes from the workspace base.
constexpr size_t kWorkspaceAlignment = 256;
// Largest bucket table of a (weighted) LSH cumulation: 2^26 floats = 256 MiB.
constexpr int64_t kTableBudgetFloats = int64_t{1} << 26;
// Dynamic shared memory a block may use without opting in (cudaFuncSetAttribute).
constexpr size_t kDefaultSharedBytes = 48 * 1024;

// ---------------------------------------------------------------------------
// Element types.

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__half v) { return __half2float(v); }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ T FromFloat(float v);
template <>
__device__ inline float FromFloat<float>(float v) { return v; }
template <>
__device__ inline __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// The one place that maps a ScalarType to its device element type: calls
// fn(TypeTag<T>{}) and returns its status, or cudaErrorInvalidValue for an
// unknown dtype.
template <typename Fn>
cudaError_t DispatchScalarType(ScalarType dtype, Fn&& fn) {
  switch (dtype) {
    case ScalarType::kFloat32:
      return fn(TypeTag<float>{});
    case ScalarType::kFloat16:
      return fn(TypeTag<__half>{});
    case ScalarType::kBFloat16:
      return fn(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

// ---------------------------------------------------------------------------
// Launch and indexing helpers.

__device__ inline int64_t GlobalThreadIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ inline int64_t GlobalThreadCount() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Launches `kernel` with enough kThreadsPerBlock-thread blocks for
// `work_items` threads (capped at kMaxBlocks; kernels loop over the rest).
// Launches nothing when work_items is 0.
template <typename... Params, typename... Args>
cudaError_t LaunchGridStride(int64_t work_items, cudaStream_t stream, void (*kernel)(Params...),
                             Args&&... args) {
  if (work_items <= 0) return cudaSuccess;
  const int64_t blocks =
      std::min<int64_t>((work_items + kThreadsPerBlock - 1) / kThreadsPerBlock, kMaxBlocks);
  kernel<<<static_cast<unsigned int>(blocks), kThreadsPerBlock, 0, stream>>>(
      std::forward<Args>(args)...);
  return cudaGetLastError();
}

size_t AlignWorkspace(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

template <typename T>
T* WorkspaceAt(void* workspace, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(workspace) + offset);
}

bool ValidCumulationDims(const CumulationDims& d) {
  return d.batch >= 0 && d.num_hashes >= 1 && d.num_queries >= 0 && d.num_keys >= 0 &&
         d.weight_dim >= 0 && d.value_dim >= 0 && d.vector_dim >= 0 && d.num_buckets >= 1;
}

// ---------------------------------------------------------------------------
// Invalid-code count.

// *device_count += number of codes[0, count) outside [0, num_buckets).
__global__ void CountInvalidCodesKernel(const int32_t* codes, int64_t count, int64_t num_buckets,
                                        unsigned long long* device_count) {
  unsigned long long invalid = 0;
  for (int64_t k = GlobalThreadIndex(); k < count; k += GlobalThreadCount()) {
    invalid += ValidCode(codes[k], num_buckets) ? 0 : 1;
  }
  if (invalid != 0) atomicAdd(device_count, invalid);
}

// ---------------------------------------------------------------------------
// Hash codes.

// Dense hyperplane LSH (appendix §1.2, F(x) = sign(Px)); one thread per code:
// codes[b, h, n] = sum_i [<x[b, n, :], projection[:, h * tau + i]> > 0] << i.
// x [B, N, d], projection [d, m * tau] -> codes [B, m, N].
template <typename T>
__global__ void GaussianHashCodesKernel(HashDims d, const T* x, const float* projection,
                                        int32_t* codes) {
  const int64_t bits = d.num_hashes * d.hash_code_len;
  const int64_t total = d.batch * d.num_hashes * d.length;
  for (int64_t k = GlobalThreadIndex(); k < total; k += GlobalThreadCount()) {
    const int64_t n = k % d.length;
    const int64_t h = (k / d.length) % d.num_hashes;
    const int64_t b = k / (d.length * d.num_hashes);
    const T* xr = x + (b * d.length + n) * d.dim;
    const float* column = projection + h * d.hash_code_len;
    int32_t code = 0;
    for (int64_t i = 0; i < d.hash_code_len; ++i) {
      float dot = 0.0f;
      for (int64_t c = 0; c < d.dim; ++c) dot += ToFloat(xr[c]) * column[c * bits + i];
      code |= static_cast<int32_t>(dot > 0.0f) << i;
    }
    codes[k] = code;
  }
}

// In-place unnormalized fast Walsh-Hadamard transform of y[0, n) in shared
// memory, Sylvester order (H_2n = [[H_n, H_n], [H_n, -H_n]]), by the whole
// block. n is a power of two; returns after a __syncthreads(). In double, like
// the CPU kernel: the +-1 sums of float32 inputs are exact, so structural zeros
// of H D3 H D2 H D1 x stay 0 and every implementation produces the same bits.
__device__ void BlockFastHadamardTransform(double* y, int64_t n) {
  for (int64_t len = 1; len < n; len <<= 1) {
    for (int64_t k = threadIdx.x; k < n / 2; k += blockDim.x) {
      const int64_t i = (k / len) * 2 * len + k % len;
      const double a = y[i];
      const double b = y[i + len];
      y[i] = a + b;
      y[i + len] = a - b;
    }
    __syncthreads();
  }
}

// Fast Hadamard LSH (appendix §1.2), the block form, for the calls the row form
// (RowHadamardHashCodesKernel) does not take: padded_dim > 256, or too many hashes for its shared
// memory. One block per (b, n, q) unit:
// y = H D3 H D2 H D1 pad(x[b, n, :]) with D_p = diag(signs[q, p - 1, :]), and
// sign bit g = HadamardBitOfRow(d, q, t) (g < m * tau; yoso_common.h) is ORed into bit
// g % tau of codes[b, g / tau, n]. codes must be zero on entry. Dynamic shared memory:
// padded_dim doubles.
template <typename T>
__global__ void HadamardHashCodesKernel(HashDims d, const T* x, const float* signs,
                                        int32_t* codes) {
  extern __shared__ double y[];
  const int64_t p = d.padded_dim;
  const int64_t bits = d.num_hashes * d.hash_code_len;
  const int64_t units = d.batch * d.length * d.num_blocks;
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int64_t q = unit % d.num_blocks;
    const int64_t row = unit / d.num_blocks;
    const int64_t b = row / d.length;
    const int64_t n = row % d.length;
    const T* xr = x + row * d.dim;
    const float* block_signs = signs + q * 3 * p;
    for (int64_t t = threadIdx.x; t < p; t += blockDim.x) {
      y[t] = static_cast<double>(t < d.dim ? ToFloat(xr[t]) : 0.0f) * block_signs[t];
    }
    __syncthreads();
    BlockFastHadamardTransform(y, p);
    for (int64_t stage = 1; stage < 3; ++stage) {
      for (int64_t t = threadIdx.x; t < p; t += blockDim.x) y[t] *= block_signs[stage * p + t];
      __syncthreads();
      BlockFastHadamardTransform(y, p);
    }
    for (int64_t t = threadIdx.x; t < p; t += blockDim.x) {
      const int64_t g = HadamardBitOfRow(d, q, t);
      if (g < bits && y[t] > 0.0) {
        atomicOr(&codes[(b * d.num_hashes + g / d.hash_code_len) * d.length + n],
                 1 << (g % d.hash_code_len));
      }
    }
    __syncthreads();
  }
}

// Element i of x as a float, whatever its dtype: the loader of StageRows (hadamard_rows.h). The dtype is a
// kernel argument rather than a template parameter, so each padded_dim compiles one kernel, not three (the
// transform, which does not depend on it, is most of the kernel's code and of its compile time).
struct DeviceLoad {
  const void* x;
  ScalarType dtype;
  __device__ float operator()(int64_t i) const {
    switch (dtype) {
      case ScalarType::kFloat16: return ToFloat(static_cast<const __half*>(x)[i]);
      case ScalarType::kBFloat16: return ToFloat(static_cast<const __nv_bfloat16*>(x)[i]);
      default: return static_cast<const float*>(x)[i];
    }
  }
};

// The partner's value for SplitHadamard (hadamard_rows.h): a shuffle among the kParts lanes of one row,
// which run or return together.
struct LaneExchange {
  unsigned int mask;
  __device__ double operator()(double v, int span) const { return __shfl_xor_sync(mask, v, span); }
};

// The row form of the Hadamard hash (hadamard_rows.h): the transform in registers, one thread per row
// up to P = 64 and P / 64 lanes per row above, each code word stored once. Blocks of
// kRowHadamardThreads threads; dynamic shared memory RowHadamardSharedBytes(P, m). P = padded_dim.
template <int P>
__global__ void __launch_bounds__(kRowHadamardThreads)
    RowHadamardHashCodesKernel(HashDims d, DeviceLoad x, const float* signs, int32_t* codes) {
  constexpr int kParts = RowHadamardParts(P);
  constexpr int kRows = RowHadamardRowsPerBlock(P);
  static_assert(kWarpSize % kParts == 0, "a row's lanes lie in one warp");
  extern __shared__ float shared[];
  float* staged = shared;
  int32_t* lane_codes = reinterpret_cast<int32_t*>(shared + P * (kRows + 1));
  const unsigned int lane = threadIdx.x % kWarpSize;
  LaneExchange exchange{((1u << kParts) - 1u) << (lane / kParts * kParts)};
  const int64_t rows = d.batch * d.length;
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows; row0 < rows;
       row0 += static_cast<int64_t>(gridDim.x) * kRows) {
    StageRows(d, x, row0, threadIdx.x, blockDim.x, staged);
    __syncthreads();
    HashStagedRow<P>(d, signs, staged, row0, threadIdx.x, lane_codes, exchange);
    __syncthreads();
    WriteRowCodes<P>(d, row0, threadIdx.x, lane_codes, codes);
    __syncthreads();  // staged and lane_codes are overwritten by the next group of rows
  }
}

template <int P>
cudaError_t LaunchRowHadamard(const HashDims& d, DeviceLoad x, const float* signs, int32_t* codes,
                              cudaStream_t stream) {
  constexpr int kRows = RowHadamardRowsPerBlock(P);
  const int64_t groups = (d.batch * d.length + kRows - 1) / kRows;
  const unsigned int blocks = static_cast<unsigned int>(std::min(groups, kMaxBlocks));
  RowHadamardHashCodesKernel<P><<<blocks, kRowHadamardThreads,
                                  static_cast<size_t>(RowHadamardSharedBytes(P, d.num_hashes)), stream>>>(
      d, x, signs, codes);
  return cudaGetLastError();
}

// The row form for padded_dim p (a power of two <= kRowHadamardMaxPaddedDim).
cudaError_t RowHadamardHashCodes(const HashDims& d, DeviceLoad x, const float* signs, int32_t* codes,
                                 cudaStream_t stream) {
  static_assert(kRowHadamardMaxPaddedDim == 256, "one case per power of two up to the limit");
  switch (d.padded_dim) {
    case 1: return LaunchRowHadamard<1>(d, x, signs, codes, stream);
    case 2: return LaunchRowHadamard<2>(d, x, signs, codes, stream);
    case 4: return LaunchRowHadamard<4>(d, x, signs, codes, stream);
    case 8: return LaunchRowHadamard<8>(d, x, signs, codes, stream);
    case 16: return LaunchRowHadamard<16>(d, x, signs, codes, stream);
    case 32: return LaunchRowHadamard<32>(d, x, signs, codes, stream);
    case 64: return LaunchRowHadamard<64>(d, x, signs, codes, stream);
    case 128: return LaunchRowHadamard<128>(d, x, signs, codes, stream);
    case 256: return LaunchRowHadamard<256>(d, x, signs, codes, stream);
  }
  return cudaErrorInvalidValue;
}

// ---------------------------------------------------------------------------
// LSH cumulation with a bucket table (paper §3.2, Figure 3).
//
// A slab is one (b, h) pair, s = b * m + h (the row of codes [B, m, N]). The
// table holds, for a block of slabs, a block of weight columns and a block of
// value columns, [slabs, num_buckets, weight_block, value_block] floats; the
// three blocks are chosen so it fits kTableBudgetFloats. The unweighted
// cumulation is the weighted one with a single all-ones weight column
// (weight pointers nullptr, weight_width 1).

struct TablePlan {
  int64_t value_block;   // value columns per pass
  int64_t weight_block;  // weight columns per pass
  int64_t slab_block;    // (b, h) slabs per pass
  size_t table_bytes;    // workspace [0, table_bytes): the bucket table
  size_t total_bytes;    // then the float accumulator [B, Nq, D]
};

TablePlan PlanTable(const CumulationDims& d, int64_t weight_width) {
  TablePlan plan{};
  const int64_t outputs = d.batch * d.num_queries * d.value_dim;
  if (outputs == 0) return plan;
  const int64_t buckets = std::max<int64_t>(d.num_buckets, 1);
  const int64_t row_budget = std::max<int64_t>(1, kTableBudgetFloats / buckets);
  plan.value_block = std::min(d.value_dim, row_budget);
  plan.weight_block = std::max<int64_t>(1, std::min(weight_width, row_budget / plan.value_block));
  const int64_t row = plan.value_block * plan.weight_block;
  const int64_t slabs = d.batch * d.num_hashes;
  plan.slab_block = std::max<int64_t>(1, std::min(slabs, kTableBudgetFloats / (buckets * row)));
  const bool has_table = d.num_keys > 0 && weight_width > 0;
  plan.table_bytes =
      has_table ? AlignWorkspace(static_cast<size_t>(plan.slab_block * buckets * row) *
                                 sizeof(float))
                : 0;
  plan.total_bytes =
      plan.table_bytes + AlignWorkspace(static_cast<size_t>(outputs) * sizeof(float));
  return plan;
}

// Adds every kept key of slabs [slab_begin, slab_begin + num_slabs) into its
// bucket: table[s - slab_begin, kc[b, h, j], w, c] +=
//   key_weight[b, j, weight_begin + w] * value[b, j, value_begin + c]
// (weight 1 when key_weight is nullptr). Keys with key_mask == 0 or a code
// outside [0, num_buckets) are skipped, so their values are never read.
template <typename T>
__global__ void ScatterKeysToBucketsKernel(CumulationDims d, int64_t weight_width,
                                           const float* key_mask, const int32_t* key_codes,
                                           const T* key_weight, const T* value,
                                           int64_t slab_begin, int64_t num_slabs,
                                           int64_t weight_begin, int64_t weight_count,
                                           int64_t value_begin, int64_t value_count,
                                           float* table) {
  const int64_t total = num_slabs * d.num_keys * weight_count * value_count;
  for (int64_t k = GlobalThreadIndex(); k < total; k += GlobalThreadCount()) {
    const int64_t c = k % value_count;
    const int64_t w = (k / value_count) % weight_count;
    const int64_t j = (k / (value_count * weight_count)) % d.num_keys;
    const int64_t slab = k / (value_count * weight_count * d.num_keys);
    const int64_t s = slab_begin + slab;
    const int64_t key_row = (s / d.num_hashes) * d.num_keys + j;
    if (key_mask[key_row] == 0.0f) continue;
    const int32_t code = key_codes[s * d.num_keys + j];
    if (!ValidCode(code, d.num_buckets)) continue;
    float contribution = ToFloat(value[key_row * d.value_dim + value_begin + c]);
    if (key_weight != nullptr) {
      contribution *= ToFloat(key_weight[key_row * weight_width + weight_begin + w]);
    }
    atomicAdd(&table[((slab * d.num_buckets + code) * weight_count + w) * value_count + c],
              contribution);
  }
}

// For every kept query of a batch that slabs [slab_begin, slab_begin +
// num_slabs) touch, reads its bucket in each of those slabs, in hash order:
// accumulator[b, i, value_begin + c] += sum_h sum_w
//   query_weight[b, i, weight_begin + w] * table[s - slab_begin, qc[b, h, i], w, c]
// (weight 1 when query_weight is nullptr). One thread owns each accumulator
// element, so the update is race-free.
template <typename T>
__global__ void GatherQueriesFromBucketsKernel(CumulationDims d, int64_t weight_width,
                                               const float* query_mask,
                                               const int32_t* query_codes,
                                               const T* query_weight, const float* table,
                                               int64_t slab_begin, int64_t num_slabs,
                                               int64_t weight_begin, int64_t weight_count,
                                               int64_t value_begin, int64_t value_count,
                                               float* accumulator) {
  const int64_t slab_end = slab_begin + num_slabs;
  const int64_t batch_begin = slab_begin / d.num_hashes;
  const int64_t batch_end = (slab_end - 1) / d.num_hashes + 1;
  const int64_t total = (batch_end - batch_begin) * d.num_queries * value_count;
  for (int64_t k = GlobalThreadIndex(); k < total; k += GlobalThreadCount()) {
    const int64_t c = k % value_count;
    const int64_t i = (k / value_count) % d.num_queries;
    const int64_t b = batch_begin + k / (value_count * d.num_queries);
    const int64_t query_row = b * d.num_queries + i;
    if (query_mask[query_row] == 0.0f) continue;
    const int64_t batch_first_slab = b * d.num_hashes;
    const int64_t batch_end_slab = batch_first_slab + d.num_hashes;
    const int64_t first = slab_begin > batch_first_slab ? slab_begin : batch_first_slab;
    const int64_t last = slab_end < batch_end_slab ? slab_end : batch_end_slab;
    float sum = 0.0f;
    for (int64_t s = first; s < last; ++s) {
      const int32_t code = query_codes[s * d.num_queries + i];
      if (!ValidCode(code, d.num_buckets)) continue;
      const float* bucket =
          table + ((s - slab_begin) * d.num_buckets + code) * weight_count * value_count + c;
      if (query_weight == nullptr) {
        sum += bucket[0];
      } else {
        const T* qw = query_weight + query_row * weight_width + weight_begin;
        for (int64_t w = 0; w < weight_count; ++w) sum += ToFloat(qw[w]) * bucket[w * value_count];
      }
    }
    accumulator[query_row * d.value_dim + value_begin + c] += sum;
  }
}

// out[b, i, c] = query_mask[b, i] != 0 ? accumulator[b, i, c] * scale : 0.
// accumulator and out are [rows, width].
template <typename T>
__global__ void WriteMaskedScaledKernel(int64_t rows, int64_t width, float scale,
                                        const float* query_mask, const float* accumulator,
                                        T* out) {
  const int64_t total = rows * width;
  for (int64_t k = GlobalThreadIndex(); k < total; k += GlobalThreadCount()) {
    out[k] = FromFloat<T>(query_mask[k / width] != 0.0f ? accumulator[k] * scale : 0.0f);
  }
}

// Shared driver of LshCumulationGpu (weights nullptr, weight_width 1) and
// WeightedLshCumulationGpu: out = qmask / m * sum_h sum_j kmask [qc == kc]
// <query_weight_i, key_weight_j> value_j (YOSO eq. 2 averaged over m hashes).
template <typename T>
cudaError_t TableCumulation(const CumulationDims& d, int64_t weight_width,
                            const float* query_mask, const int32_t* query_codes,
                            const T* query_weight, const float* key_mask,
                            const int32_t* key_codes, const T* key_weight, const T* value, T* out,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const int64_t outputs = d.batch * d.num_queries * d.value_dim;
  if (outputs == 0) return cudaSuccess;
  const TablePlan plan = PlanTable(d, weight_width);
  if (workspace == nullptr || workspace_bytes < plan.total_bytes) return cudaErrorInvalidValue;
  float* table = WorkspaceAt<float>(workspace, 0);
  float* accumulator = WorkspaceAt<float>(workspace, plan.table_bytes);
  cudaError_t err =
      cudaMemsetAsync(accumulator, 0, static_cast<size_t>(outputs) * sizeof(float), stream);
  if (err != cudaSuccess) return err;
  // Without a table (no keys, or no weight columns) every output is 0.
  const int64_t table_weight_width = plan.table_bytes > 0 ? weight_width : 0;
  const int64_t slabs = d.batch * d.num_hashes;
  for (int64_t w0 = 0; w0 < table_weight_width; w0 += plan.weight_block) {
    const int64_t wc = std::min(plan.weight_block, table_weight_width - w0);
    for (int64_t c0 = 0; c0 < d.value_dim; c0 += plan.value_block) {
      const int64_t vc = std::min(plan.value_block, d.value_dim - c0);
      for (int64_t s0 = 0; s0 < slabs; s0 += plan.slab_block) {
        const int64_t ns = std::min(plan.slab_block, slabs - s0);
        err = cudaMemsetAsync(table, 0,
                              static_cast<size_t>(ns * d.num_buckets * wc * vc) * sizeof(float),
                              stream);
        if (err != cudaSuccess) return err;
        err = LaunchGridStride(ns * d.num_keys * wc * vc, stream, ScatterKeysToBucketsKernel<T>, d,
                               weight_width, key_mask, key_codes, key_weight, value, s0, ns, w0,
                               wc, c0, vc, table);
        if (err != cudaSuccess) return err;
        const int64_t batches = (s0 + ns - 1) / d.num_hashes - s0 / d.num_hashes + 1;
        err = LaunchGridStride(batches * d.num_queries * vc, stream,
                               GatherQueriesFromBucketsKernel<T>, d, weight_width, query_mask,
                               query_codes, query_weight, static_cast<const float*>(table), s0,
                               ns, w0, wc, c0, vc, accumulator);
        if (err != cudaSuccess) return err;
      }
    }
  }
  const float scale = 1.0f / static_cast<float>(d.num_hashes);
  return LaunchGridStride(outputs, stream, WriteMaskedScaledKernel<T>, d.batch * d.num_queries,
                          d.value_dim, scale, query_mask,
                          static_cast<const float*>(accumulator), out);
}

// ---------------------------------------------------------------------------
// Collision estimator (*YOSO, appendix §1.3 "Estimating backpropagation based
// on (2)"), restricted to colliding pairs.
//
// Workspace: for every (b, h) row of key codes, the codes sorted ascending and
// the key indices in that order ([B, m, Nk] int32 each), the inputs of the
// sort (key indices 0..Nk-1 per row and the row offsets, for one sort call),
// CUB's temporary storage and a float accumulator [B, Nq, d]. CUB sorts at
// most INT_MAX items per call, so rows are sorted in calls of
// rows_per_sort rows.

struct CollisionPlan {
  int64_t rows_per_sort;
  size_t cub_temp_bytes;
  size_t sorted_codes_offset;
  size_t sorted_index_offset;
  size_t key_index_offset;
  size_t row_offsets_offset;
  size_t cub_temp_offset;
  size_t accumulator_offset;
  size_t total_bytes;
};

cudaError_t CubSortTempBytes(int64_t items, int64_t rows, size_t* bytes) {
  *bytes = 0;
  return cub::DeviceSegmentedRadixSort::SortPairs(
      nullptr, *bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<int>(items), static_cast<int>(rows), static_cast<const int*>(nullptr),
      static_cast<const int*>(nullptr));
}

// Fills *plan; total_bytes is 0 when the output is empty. Fails when Nk does
// not fit the int32 key indices or CUB's size query fails.
cudaError_t PlanCollision(const CumulationDims& d, CollisionPlan* plan) {
  *plan = CollisionPlan{};
  const int64_t outputs = d.batch * d.num_queries * d.vector_dim;
  if (outputs == 0) return cudaSuccess;
  if (d.num_keys > INT_MAX) return cudaErrorInvalidValue;
  const int64_t rows = d.batch * d.num_hashes;
  const int64_t keys = rows * d.num_keys;
  size_t offset = 0;
  if (keys > 0) {
    plan->rows_per_sort = std::min<int64_t>(rows, INT_MAX / d.num_keys);
    const int64_t last_rows = rows % plan->rows_per_sort;
    cudaError_t err = CubSortTempBytes(plan->rows_per_sort * d.num_keys, plan->rows_per_sort,
                                       &plan->cub_temp_bytes);
    if (err != cudaSuccess) return err;
    if (last_rows > 0) {
      size_t last_bytes = 0;
      err = CubSortTempBytes(last_rows * d.num_keys, last_rows, &last_bytes);
      if (err != cudaSuccess) return err;
      plan->cub_temp_bytes = std::max(plan->cub_temp_bytes, last_bytes);
    }
    const size_t key_bytes = static_cast<size_t>(keys) * sizeof(int32_t);
    plan->sorted_codes_offset = offset;
    offset += AlignWorkspace(key_bytes);
    plan->sorted_index_offset = offset;
    offset += AlignWorkspace(key_bytes);
    plan->key_index_offset = offset;
    offset += AlignWorkspace(static_cast<size_t>(plan->rows_per_sort * d.num_keys) *
                             sizeof(int32_t));
    plan->row_offsets_offset = offset;
    offset += AlignWorkspace(static_cast<size_t>(plan->rows_per_sort + 1) * sizeof(int));
    plan->cub_temp_offset = offset;
    offset += AlignWorkspace(plan->cub_temp_bytes);
  }
  plan->accumulator_offset = offset;
  offset += AlignWorkspace(static_cast<size_t>(outputs) * sizeof(float));
  plan->total_bytes = offset;
  return cudaSuccess;
}

// The inputs of one segmented sort call over `rows` rows of Nk keys:
// key_index[r * Nk + j] = j and row_offsets[r] = r * Nk for r in [0, rows].
__global__ void FillSortInputsKernel(int64_t rows, int64_t num_keys, int32_t* key_index,
                                     int* row_offsets) {
  for (int64_t k = GlobalThreadIndex(); k < rows * num_keys; k += GlobalThreadCount()) {
    key_index[k] = static_cast<int32_t>(k % num_keys);
  }
  for (int64_t r = GlobalThreadIndex(); r <= rows; r += GlobalThreadCount()) {
    row_offsets[r] = static_cast<int>(r * num_keys);
  }
}

// First position p in sorted[0, n) with sorted[p] >= value (n if none).
__device__ int64_t LowerBound(const int32_t* sorted, int64_t n, int32_t value) {
  int64_t lo = 0;
  int64_t hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Sum of v over the 32 lanes of a fully active warp; every lane gets the same
// bits (each butterfly step adds the same two values in every lane).
__device__ float WarpSum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// One warp per query row (b, i); lanes split the feature columns. For each
// hash h with a valid query code, walks the keys j of that bucket (sorted
// codes of row (b, h)) and, when key_mask[b, j] != 0 and h is the first hash
// in which i and j collide, adds
//   w_ij key[b, j, :],  w_ij = <query_weight[b, i], key_weight[b, j]>
//                             * CollisionDerivative(<query[b, i], key[b, j]>, tau, epsilon)
// into accumulator[b, i, :] (lane-owned columns, float32), then writes out.
// Masked queries write 0 and read nothing else.
// query / key [B, N, d], query_weight / key_weight [B, N, D] -> out [B, Nq, d].
// Every branch depends only on (row, h, key), so all lanes of a warp reach
// each WarpSum together.
template <typename T>
__global__ void CollisionCumulationKernel(CumulationDims d, int hash_code_len, float epsilon,
                                          const float* query_mask, const int32_t* query_codes,
                                          const T* query, const T* query_weight,
                                          const float* key_mask, const int32_t* key_codes,
                                          const T* key, const T* key_weight,
                                          const int32_t* sorted_codes,
                                          const int32_t* sorted_index, float* accumulator,
                                          T* out) {
  const int64_t lane = threadIdx.x % kWarpSize;
  const int64_t rows = d.batch * d.num_queries;
  const int64_t dv = d.vector_dim;
  const int64_t dw = d.weight_dim;
  for (int64_t row = GlobalThreadIndex() / kWarpSize; row < rows;
       row += GlobalThreadCount() / kWarpSize) {
    T* out_row = out + row * dv;
    if (query_mask[row] == 0.0f) {
      for (int64_t c = lane; c < dv; c += kWarpSize) out_row[c] = FromFloat<T>(0.0f);
      continue;
    }
    float* acc = accumulator + row * dv;
    for (int64_t c = lane; c < dv; c += kWarpSize) acc[c] = 0.0f;
    const int64_t b = row / d.num_queries;
    const int64_t i = row % d.num_queries;
    const int32_t* qc = query_codes + b * d.num_hashes * d.num_queries + i;
    const T* qv = query + row * dv;
    const T* qw = query_weight + row * dw;
    for (int64_t h = 0; h < d.num_hashes; ++h) {
      const int32_t code = qc[h * d.num_queries];
      if (!ValidCode(code, d.num_buckets)) continue;
      const int64_t key_codes_row = (b * d.num_hashes + h) * d.num_keys;
      const int32_t* codes_row = sorted_codes + key_codes_row;
      const int32_t* index_row = sorted_index + key_codes_row;
      for (int64_t p = LowerBound(codes_row, d.num_keys, code);
           p < d.num_keys && codes_row[p] == code; ++p) {
        const int64_t j = index_row[p];
        const int64_t key_row = b * d.num_keys + j;
        if (key_mask[key_row] == 0.0f) continue;
        const int32_t* kc = key_codes + b * d.num_hashes * d.num_keys + j;
        if (!IsFirstCollision(qc, d.num_queries, kc, d.num_keys, h)) continue;
        const T* kv = key + key_row * dv;
        const T* kw = key_weight + key_row * dw;
        float similarity = 0.0f;
        float weight = 0.0f;
        for (int64_t c = lane; c < dv; c += kWarpSize) {
          similarity += ToFloat(qv[c]) * ToFloat(kv[c]);
        }
        for (int64_t c = lane; c < dw; c += kWarpSize) weight += ToFloat(qw[c]) * ToFloat(kw[c]);
        similarity = WarpSum(similarity);
        weight = WarpSum(weight);
        const float w = weight * CollisionDerivative(similarity, hash_code_len, epsilon);
        for (int64_t c = lane; c < dv; c += kWarpSize) acc[c] += w * ToFloat(kv[c]);
      }
    }
    for (int64_t c = lane; c < dv; c += kWarpSize) out_row[c] = FromFloat<T>(acc[c]);
  }
}

}  // namespace

cudaError_t CountInvalidCodesGpu(const int32_t* codes, int64_t count, int64_t num_buckets,
                                 unsigned long long* device_count, cudaStream_t stream) {
  if (count < 0 || device_count == nullptr) return cudaErrorInvalidValue;
  const cudaError_t err = cudaMemsetAsync(device_count, 0, sizeof(*device_count), stream);
  if (err != cudaSuccess) return err;
  return LaunchGridStride(count, stream, CountInvalidCodesKernel, codes, count, num_buckets,
                          device_count);
}

cudaError_t GaussianHashCodesGpu(const HashDims& dims, ScalarType dtype, const void* x,
                                 const float* projection, int32_t* codes, cudaStream_t stream) {
  if (dims.batch < 0 || dims.length < 0 || dims.dim < 0 || dims.num_hashes < 0 ||
      dims.hash_code_len < 1 || dims.hash_code_len > kMaxHashCodeLen) {
    return cudaErrorInvalidValue;
  }
  return DispatchScalarType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchGridStride(dims.batch * dims.num_hashes * dims.length, stream,
                            GaussianHashCodesKernel<T>, dims, static_cast<const T*>(x),
                            projection, codes);
  });
}

cudaError_t HadamardHashCodesGpu(const HashDims& dims, ScalarType dtype, const void* x,
                                 const float* signs, int32_t* codes, cudaStream_t stream) {
  const int64_t p = dims.padded_dim;
  if (dims.batch < 0 || dims.length < 0 || dims.dim < 0 || dims.num_hashes < 0 ||
      dims.hash_code_len < 1 || dims.hash_code_len > kMaxHashCodeLen || dims.num_blocks < 0 ||
      p < 1 || (p & (p - 1)) != 0 || p > INT_MAX / static_cast<int64_t>(sizeof(double))) {
    return cudaErrorInvalidValue;
  }
  const int64_t num_codes = dims.batch * dims.num_hashes * dims.length;
  if (num_codes == 0) return cudaSuccess;
  if (UsesRowHadamard(dims, kDefaultSharedBytes)) {
    // DispatchScalarType only to refuse an unknown dtype: DeviceLoad reads the dtype at each load.
    return DispatchScalarType(dtype, [&](auto) {
      return RowHadamardHashCodes(dims, DeviceLoad{x, dtype}, signs, codes, stream);
    });
  }
  cudaError_t err =
      cudaMemsetAsync(codes, 0, static_cast<size_t>(num_codes) * sizeof(int32_t), stream);
  if (err != cudaSuccess) return err;
  const int64_t units = dims.batch * dims.length * dims.num_blocks;
  if (units == 0) return cudaSuccess;
  const unsigned int blocks = static_cast<unsigned int>(std::min(units, kMaxBlocks));
  // One thread per butterfly of the transform, between one warp and kThreadsPerBlock.
  const int threads =
      static_cast<int>(std::min<int64_t>(kThreadsPerBlock, std::max<int64_t>(kWarpSize, p / 2)));
  const size_t shared_bytes = static_cast<size_t>(p) * sizeof(double);
  return DispatchScalarType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (shared_bytes > kDefaultSharedBytes) {
      // Fails when padded_dim doubles exceed the device's opt-in shared memory per
      // block (padded_dim <= kMaxGpuHadamardPaddedDim fits every supported GPU).
      const cudaError_t attr_err =
          cudaFuncSetAttribute(HadamardHashCodesKernel<T>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(shared_bytes));
      if (attr_err != cudaSuccess) {
        cudaGetLastError();  // clear it, so a later launch check does not report it again
        return attr_err;
      }
    }
    HadamardHashCodesKernel<T><<<blocks, threads, shared_bytes, stream>>>(
        dims, static_cast<const T*>(x), signs, codes);
    return cudaGetLastError();
  });
}

size_t LshCumulationWorkspaceBytes(const CumulationDims& dims) {
  if (!ValidCumulationDims(dims)) return 0;
  return PlanTable(dims, 1).total_bytes;
}

cudaError_t LshCumulationGpu(const CumulationDims& dims, ScalarType dtype,
                             const float* query_mask, const int32_t* query_codes,
                             const float* key_mask, const int32_t* key_codes, const void* value,
                             void* out, void* workspace, size_t workspace_bytes,
                             cudaStream_t stream) {
  if (!ValidCumulationDims(dims)) return cudaErrorInvalidValue;
  return DispatchScalarType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return TableCumulation<T>(dims, 1, query_mask, query_codes, nullptr, key_mask, key_codes,
                              nullptr, static_cast<const T*>(value), static_cast<T*>(out),
                              workspace, workspace_bytes, stream);
  });
}

size_t WeightedLshCumulationWorkspaceBytes(const CumulationDims& dims) {
  if (!ValidCumulationDims(dims)) return 0;
  return PlanTable(dims, dims.weight_dim).total_bytes;
}

cudaError_t WeightedLshCumulationGpu(const CumulationDims& dims, ScalarType dtype,
                                     const float* query_mask, const int32_t* query_codes,
                                     const void* query_weight, const float* key_mask,
                                     const int32_t* key_codes, const void* key_weight,
                                     const void* value, void* out, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream) {
  if (!ValidCumulationDims(dims)) return cudaErrorInvalidValue;
  return DispatchScalarType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return TableCumulation<T>(dims, dims.weight_dim, query_mask, query_codes,
                              static_cast<const T*>(query_weight), key_mask, key_codes,
                              static_cast<const T*>(key_weight), static_cast<const T*>(value),
                              static_cast<T*>(out), workspace, workspace_bytes, stream);
  });
}

size_t CollisionCumulationWorkspaceBytes(const CumulationDims& dims) {
  CollisionPlan plan;
  // On failure 0 is returned; CollisionCumulationGpu then reports the error itself.
  if (!ValidCumulationDims(dims) || PlanCollision(dims, &plan) != cudaSuccess) return 0;
  return plan.total_bytes;
}

cudaError_t CollisionCumulationGpu(const CumulationDims& dims, ScalarType dtype,
                                   int hash_code_len, float epsilon, const float* query_mask,
                                   const int32_t* query_codes, const void* query,
                                   const void* query_weight, const float* key_mask,
                                   const int32_t* key_codes, const void* key,
                                   const void* key_weight, void* out, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream) {
  if (!ValidCumulationDims(dims)) return cudaErrorInvalidValue;
  const int64_t rows = dims.batch * dims.num_queries;
  if (rows * dims.vector_dim == 0) return cudaSuccess;
  CollisionPlan plan;
  cudaError_t err = PlanCollision(dims, &plan);
  if (err != cudaSuccess) return err;
  if (workspace == nullptr || workspace_bytes < plan.total_bytes) return cudaErrorInvalidValue;
  int32_t* sorted_codes = WorkspaceAt<int32_t>(workspace, plan.sorted_codes_offset);
  int32_t* sorted_index = WorkspaceAt<int32_t>(workspace, plan.sorted_index_offset);
  const int64_t key_rows = dims.batch * dims.num_hashes;
  if (key_rows * dims.num_keys > 0) {
    int32_t* key_index = WorkspaceAt<int32_t>(workspace, plan.key_index_offset);
    int* row_offsets = WorkspaceAt<int>(workspace, plan.row_offsets_offset);
    err = LaunchGridStride(plan.rows_per_sort * dims.num_keys + 1, stream, FillSortInputsKernel,
                           plan.rows_per_sort, dims.num_keys, key_index, row_offsets);
    if (err != cudaSuccess) return err;
    for (int64_t r0 = 0; r0 < key_rows; r0 += plan.rows_per_sort) {
      const int64_t nr = std::min(plan.rows_per_sort, key_rows - r0);
      size_t temp_bytes = plan.cub_temp_bytes;
      err = cub::DeviceSegmentedRadixSort::SortPairs(
          WorkspaceAt<void>(workspace, plan.cub_temp_offset), temp_bytes,
          key_codes + r0 * dims.num_keys, sorted_codes + r0 * dims.num_keys,
          static_cast<const int32_t*>(key_index), sorted_index + r0 * dims.num_keys,
          static_cast<int>(nr * dims.num_keys), static_cast<int>(nr),
          static_cast<const int*>(row_offsets), static_cast<const int*>(row_offsets) + 1, 0,
          static_cast<int>(sizeof(int32_t) * 8), stream);
      if (err != cudaSuccess) return err;
    }
  }
  float* accumulator = WorkspaceAt<float>(workspace, plan.accumulator_offset);
  return DispatchScalarType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchGridStride(rows * kWarpSize, stream, CollisionCumulationKernel<T>, dims,
                            hash_code_len, epsilon, query_mask, query_codes,
                            static_cast<const T*>(query), static_cast<const T*>(query_weight),
                            key_mask, key_codes, static_cast<const T*>(key),
                            static_cast<const T*>(key_weight),
                            static_cast<const int32_t*>(sorted_codes),
                            static_cast<const int32_t*>(sorted_index), accumulator,
                            static_cast<T*>(out));
  });
}

}  // namespace keras_yoso
