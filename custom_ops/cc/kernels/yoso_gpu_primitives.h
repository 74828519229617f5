// The GPU run of each primitive of yoso_primitives.h that has a CUDA kernel: the launchers of
// yoso_gpu.h behind one signature, so that every glue (the C ABI's ky_run_device, and through it
// the XLA FFI CUDA handlers and the torch.library CUDA kernels; the TensorFlow GPU op kernels)
// runs any of them without per-primitive code. Plain C++ over the CUDA runtime API; no framework
// include. Compiled only where the CUDA kernels are (KY_WITH_CUDA).
//
// GpuRun<P> declares, for primitive P (its Check has filled Dims d; `a` are its attributes in order;
// `in` and `out` are device tensors in P's order, in the float dtype `dtype` where P's kinds say so):
//   Check(d, a)              "" or why this call cannot run on the GPU (a limit of the CUDA kernels
//                            that the CPU kernels do not have, e.g. causal != 0)
//   WorkspaceBytes(d)        device scratch the launcher needs (the caller allocates it)
//   kDeterministic           false when the kernel's rounding depends on thread scheduling (float
//                            atomics into bucket tables): TensorFlow refuses it under op determinism
//   Run(d, dtype, a, in, out, workspace, workspace_bytes, stream)   enqueues the kernels on `stream`
//
// Adding a GPU kernel for a primitive: its launcher (yoso_gpu.h/.cu), one GpuRun specialization
// here and its name in KY_GPU_PRIMITIVES; keras_yoso/ops/_spec.py's row gets "gpu" in its
// devices (tests/test_spec.py holds the two lists together). No glue changes.
#ifndef KERAS_YOSO_KERNELS_YOSO_GPU_PRIMITIVES_H_
#define KERAS_YOSO_KERNELS_YOSO_GPU_PRIMITIVES_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "yoso_gpu.h"
#include "yoso_primitives.h"

namespace keras_yoso {

// The CUDA kernels sum over every key: the causal cumulations run on the CPU kernels (or the
// composite) until their GPU kernels exist (../shared/GPU-DESIGN.md §2.5).
inline std::string CheckGpuCausal(const char* primitive, int64_t causal) {
  if (causal == 0) return "";
  return std::string(primitive) + " has no GPU kernel for causal = " + std::to_string(causal) +
         " (the CUDA kernels take causal = 0 only)";
}

// What a primitive without a device limit or scratch declares.
struct GpuRunDefaults {
  static constexpr bool kDeterministic = true;
  template <typename Dims>
  static std::string Check(const Dims&, const AttributeValue*) { return ""; }
  template <typename Dims>
  static size_t WorkspaceBytes(const Dims&) { return 0; }
};

template <typename P>
struct GpuRun;

template <>
struct GpuRun<GaussianHashCodes> : GpuRunDefaults {
  static cudaError_t Run(const HashDims& d, ScalarType dtype, const AttributeValue*, const TensorRef* in,
                         const TensorRef* out, void*, size_t, cudaStream_t stream) {
    return GaussianHashCodesGpu(d, dtype, in[0].data, In<float>(in[1]), Out<int32_t>(out[0]), stream);
  }
};

template <bool kInterleaved>
struct GpuRun<HadamardHashCodesOf<kInterleaved>> : GpuRunDefaults {
  static std::string Check(const HashDims& d, const AttributeValue*) {
    return CheckGpuHadamardPaddedDim(d.padded_dim);
  }
  static cudaError_t Run(const HashDims& d, ScalarType dtype, const AttributeValue*, const TensorRef* in,
                         const TensorRef* out, void*, size_t, cudaStream_t stream) {
    return HadamardHashCodesGpu(d, dtype, in[0].data, In<float>(in[1]), Out<int32_t>(out[0]), stream);
  }
};

template <>
struct GpuRun<LshCumulation> : GpuRunDefaults {
  static constexpr bool kDeterministic = false;
  static std::string Check(const CumulationDims&, const AttributeValue* a) {
    return CheckGpuCausal(LshCumulation::kName, a[1].int_value);
  }
  static size_t WorkspaceBytes(const CumulationDims& d) { return LshCumulationWorkspaceBytes(d); }
  static cudaError_t Run(const CumulationDims& d, ScalarType dtype, const AttributeValue*, const TensorRef* in,
                         const TensorRef* out, void* workspace, size_t bytes, cudaStream_t stream) {
    return LshCumulationGpu(d, dtype, In<float>(in[0]), In<int32_t>(in[1]), In<float>(in[2]), In<int32_t>(in[3]),
                            in[4].data, out[0].data, workspace, bytes, stream);
  }
};

template <>
struct GpuRun<WeightedLshCumulation> : GpuRunDefaults {
  static constexpr bool kDeterministic = false;
  static std::string Check(const CumulationDims&, const AttributeValue* a) {
    return CheckGpuCausal(WeightedLshCumulation::kName, a[1].int_value);
  }
  static size_t WorkspaceBytes(const CumulationDims& d) { return WeightedLshCumulationWorkspaceBytes(d); }
  static cudaError_t Run(const CumulationDims& d, ScalarType dtype, const AttributeValue*, const TensorRef* in,
                         const TensorRef* out, void* workspace, size_t bytes, cudaStream_t stream) {
    return WeightedLshCumulationGpu(d, dtype, In<float>(in[0]), In<int32_t>(in[1]), in[2].data, In<float>(in[3]),
                                    In<int32_t>(in[4]), in[5].data, in[6].data, out[0].data, workspace, bytes,
                                    stream);
  }
};

template <>
struct GpuRun<CollisionCumulation> : GpuRunDefaults {
  static size_t WorkspaceBytes(const CumulationDims& d) { return CollisionCumulationWorkspaceBytes(d); }
  static cudaError_t Run(const CumulationDims& d, ScalarType dtype, const AttributeValue* a, const TensorRef* in,
                         const TensorRef* out, void* workspace, size_t bytes, cudaStream_t stream) {
    return CollisionCumulationGpu(d, dtype, static_cast<int>(a[0].int_value), CollisionCumulation::Epsilon(a),
                                  In<float>(in[0]), In<int32_t>(in[1]), in[2].data, in[3].data, In<float>(in[4]),
                                  In<int32_t>(in[5]), in[6].data, in[7].data, out[0].data, workspace, bytes, stream);
  }
};

// Every primitive with a CUDA kernel: X(name, struct), a sublist of KY_PRIMITIVES. _spec.py's rows
// of these names list "gpu" in their devices.
#define KY_GPU_PRIMITIVES(X)                                       \
  X(gaussian_hash_codes, GaussianHashCodes)                        \
  X(hadamard_hash_codes, HadamardHashCodes)                        \
  X(hadamard_interleaved_hash_codes, HadamardInterleavedHashCodes) \
  X(lsh_cumulation, LshCumulation)                                 \
  X(weighted_lsh_cumulation, WeightedLshCumulation)                \
  X(collision_cumulation, CollisionCumulation)

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_YOSO_GPU_PRIMITIVES_H_
