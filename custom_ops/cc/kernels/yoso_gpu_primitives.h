// The GPU run of each primitive of yoso_primitives.h that has a GPU kernel: the launchers of
// yoso_gpu.h and the Triton launch plans (triton_primitives.h) behind one signature, so that every glue (the C ABI's ky_run_device, and through it
// the XLA FFI CUDA handlers and the torch.library CUDA kernels; the TensorFlow GPU op kernels)
// runs any of them without per-primitive code. Plain C++ over the CUDA runtime API; no framework
// include. Compiled only where the CUDA kernels are (KY_WITH_CUDA).
//
// GpuRun<P> declares, for primitive P (its Check has filled Dims d; `a` are its attributes in order;
// `in` and `out` are device tensors in P's order, in the float dtype `dtype` where P's kinds say so):
//   Check(d, dtype, a)       "" or why this call cannot run on the GPU (a limit of the GPU kernels
//                            that the CPU kernels do not have, e.g. causal != 0 without the Triton
//                            kernels, or a variant the build lacks for this dtype)
//   WorkspaceBytes(d, dtype, a)   device scratch the launcher needs (the caller allocates it)
//   kDeterministic           false when the kernel's rounding depends on thread scheduling (float
//                            atomics into bucket tables): TensorFlow refuses it under op determinism
//   kHasDeterministicMode    true when it has a deterministic mode (ScopedTritonDeterministic), which
//                            TensorFlow then takes under op determinism
//   Available()              false when this build lacks the kernel (the Triton cubins are optional)
//   Run(d, dtype, a, in, out, workspace, workspace_bytes, stream)   enqueues the kernels on `stream`;
//                            "" or the CUDA error
//
// Where the Triton kernels (triton_primitives.h) plan a primitive and this library embeds cubins
// for the stream's device, Run launches them (RunTriton) and the CUDA kernels of yoso_gpu.h
// serve the other devices and calls; WorkspaceBytes covers both.
//
// Adding a GPU kernel for a primitive: its launcher (yoso_gpu.h/.cu), one GpuRun specialization
// here and its name in KY_GPU_PRIMITIVES; keras_yoso/ops/_spec.py's row gets "gpu" in its
// devices (tests/test_spec.py holds the two lists together). No glue changes.
#ifndef KERAS_YOSO_KERNELS_YOSO_GPU_PRIMITIVES_H_
#define KERAS_YOSO_KERNELS_YOSO_GPU_PRIMITIVES_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "triton_primitives.h"
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

inline std::string CudaErrorText(cudaError_t status) {
  if (status == cudaSuccess) return "";
  return std::string("CUDA error ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

// P's Triton plan for a call (TritonPlanOf<P>::Plan), or nullptr and *error saying why there is none. Each
// thread keeps its last kTritonPlansKept plans by what they depend on (dims, attributes, dtype, arch, options),
// so a call's Check and WorkspaceBytes share one plan, and Run builds its own once per shape and device (a
// training loop's calls repeat both): no plan is rebuilt, no variant looked up, per call. The pointer is valid
// until this thread's next call.
constexpr size_t kTritonPlansKept = 4;

template <typename P>
const TritonPlan* CachedTritonPlan(const typename P::Dims& d, ScalarType dtype, const AttributeValue* a, int arch,
                                   const TritonOptions& options, std::string* error) {
  static_assert(sizeof(d) % sizeof(int64_t) == 0, "the dims are int64 fields");
  using Key = std::array<int64_t, sizeof(d) / sizeof(int64_t) + P::kAttributes.size() + 4>;
  struct Kept {
    Key key;
    TritonPlan plan;
    std::string error;
  };
  Key key{};
  std::memcpy(key.data(), &d, sizeof(d));
  size_t at = sizeof(d) / sizeof(int64_t);
  for (size_t i = 0; i < P::kAttributes.size(); ++i) key[at++] = a[i].int_value;
  key[at++] = static_cast<int64_t>(dtype), key[at++] = arch;
  key[at++] = options.exact_fp32, key[at++] = options.deterministic;
  thread_local std::vector<Kept> kept;  // the most recent last
  auto found = std::find_if(kept.begin(), kept.end(), [&](const Kept& k) { return k.key == key; });
  if (found == kept.end()) {
    if (kept.size() == kTritonPlansKept) kept.erase(kept.begin());
    kept.push_back(Kept{key, {}, ""});
    found = kept.end() - 1;
    found->error = TritonPlanOf<P>::Plan(d, dtype, a, arch, options, &found->plan);
  }
  *error = found->error;
  return error->empty() ? &found->plan : nullptr;
}

// Check and WorkspaceBytes of P's Triton plan: the plan for sm_80 and the call's dtype (its workspace is the
// same for every arch: regions over the dims only) with the options of the calls made now. The dtype matters:
// which variants exist depends on it (the deterministic eq. 4 kernels with exact fp32 products stop at rows
// 64 wide, those of 16-bit rows do not).
template <typename P>
std::string CheckTriton(const typename P::Dims& d, ScalarType dtype, const AttributeValue* a) {
  std::string error;
  CachedTritonPlan<P>(d, dtype, a, 80, TritonOptionsNow(), &error);
  return error;
}

// 0 where the Triton kernels cannot take the call.
template <typename P>
size_t TritonWorkspaceBytes(const typename P::Dims& d, ScalarType dtype, const AttributeValue* a) {
  std::string error;
  const TritonPlan* plan = CachedTritonPlan<P>(d, dtype, a, 80, TritonOptionsNow(), &error);
  return plan == nullptr ? 0 : plan->workspace_bytes;
}

// Runs P's Triton plan when the library embeds cubins for the stream's device and the plan takes the call
// (*ran = true; "" or the driver's error); else *ran = false and why not ("" when the library embeds no cubin
// for the stream's device).
template <typename P>
std::string RunTriton(const typename P::Dims& d, ScalarType dtype, const AttributeValue* a, const TensorRef* in,
                      const TensorRef* out, void* workspace, size_t bytes, cudaStream_t stream, bool* ran) {
  *ran = false;
  std::string error;
  const int arch = TritonArchOfStream(stream, &error);
  if (arch == 0) return error;
  const TritonPlan* plan = CachedTritonPlan<P>(d, dtype, a, arch, TritonOptionsNow(), &error);
  if (plan == nullptr) return error;
  if (plan->workspace_bytes > bytes) {
    return "the Triton plan needs " + std::to_string(plan->workspace_bytes) + " bytes of workspace, got " +
           std::to_string(bytes);
  }
  void* inputs[P::kInputs.size()];
  void* outputs[P::kOutputs.size()];
  for (size_t i = 0; i < P::kInputs.size(); ++i) inputs[i] = in[i].data;
  for (size_t i = 0; i < P::kOutputs.size(); ++i) outputs[i] = out[i].data;
  *ran = true;
  return RunTritonPlan(*plan, inputs, outputs, workspace, stream);
}

// What a primitive without a device limit or scratch declares.
struct GpuRunDefaults {
  static constexpr bool kDeterministic = true;
  static constexpr bool kHasDeterministicMode = false;
  static bool Available() { return true; }
  template <typename Dims>
  static std::string Check(const Dims&, ScalarType, const AttributeValue*) { return ""; }
  template <typename Dims>
  static size_t WorkspaceBytes(const Dims&, ScalarType, const AttributeValue*) { return 0; }
};

template <typename P>
struct GpuRun;

template <>
struct GpuRun<GaussianHashCodes> : GpuRunDefaults {
  static std::string Run(const HashDims& d, ScalarType dtype, const AttributeValue*, const TensorRef* in,
                         const TensorRef* out, void*, size_t, cudaStream_t stream) {
    return CudaErrorText(
        GaussianHashCodesGpu(d, dtype, in[0].data, In<float>(in[1]), Out<int32_t>(out[0]), stream));
  }
};

template <bool kInterleaved>
struct GpuRun<HadamardHashCodesOf<kInterleaved>> : GpuRunDefaults {
  static std::string Check(const HashDims& d, ScalarType, const AttributeValue*) {
    return CheckGpuHadamardPaddedDim(d.padded_dim);
  }
  static std::string Run(const HashDims& d, ScalarType dtype, const AttributeValue*, const TensorRef* in,
                         const TensorRef* out, void*, size_t, cudaStream_t stream) {
    return CudaErrorText(
        HadamardHashCodesGpu(d, dtype, in[0].data, In<float>(in[1]), Out<int32_t>(out[0]), stream));
  }
};

// causal = 0: the Triton kernels on sm_80 / sm_90 where the library embeds them, else the CUDA
// kernels. causal != 0: the Triton kernels only (the causal scan).
template <>
struct GpuRun<LshCumulation> : GpuRunDefaults {
  static constexpr bool kDeterministic = false;
  static std::string Check(const CumulationDims& d, ScalarType dtype, const AttributeValue* a) {
    if (a[1].int_value == 0) return "";
    if (!TritonCubinsEmbedded()) {
      return CheckGpuCausal(LshCumulation::kName, a[1].int_value) +
             " without the Triton kernels, which this native library does not embed (KERAS_YOSO_TRITON_CUBINS, "
             "docs/build.md)";
    }
    return CheckTriton<LshCumulation>(d, dtype, a);
  }
  static size_t WorkspaceBytes(const CumulationDims& d, ScalarType dtype, const AttributeValue* a) {
    const size_t cuda = LshCumulationWorkspaceBytes(d), triton = TritonWorkspaceBytes<LshCumulation>(d, dtype, a);
    return cuda > triton ? cuda : triton;
  }
  static std::string Run(const CumulationDims& d, ScalarType dtype, const AttributeValue* a, const TensorRef* in,
                         const TensorRef* out, void* workspace, size_t bytes, cudaStream_t stream) {
    bool ran = false;
    const std::string error = RunTriton<LshCumulation>(d, dtype, a, in, out, workspace, bytes, stream, &ran);
    if (ran) return error;
    if (a[1].int_value != 0) {
      return std::string(LshCumulation::kName) + " with causal != 0 runs the Triton kernels only, which did not run: " +
             (error.empty() ? "no embedded cubin runs on this GPU (they are built for sm_80 (8.x) and sm_90a (9.0))"
                            : error);
    }
    return CudaErrorText(LshCumulationGpu(d, dtype, In<float>(in[0]), In<int32_t>(in[1]), In<float>(in[2]),
                                          In<int32_t>(in[3]), in[4].data, out[0].data, workspace, bytes, stream));
  }
};

// A primitive whose only GPU kernels are the Triton ones, where the library embeds them.
// kHasDeterministicMode: its plan is deterministic under TritonOptions::deterministic.
template <typename P, bool kIsDeterministic, bool kWithDeterministicMode = false>
struct TritonOnlyGpuRun : GpuRunDefaults {
  static constexpr bool kDeterministic = kIsDeterministic;
  static constexpr bool kHasDeterministicMode = kWithDeterministicMode;
  static bool Available() { return TritonCubinsEmbedded(); }
  static std::string Check(const CumulationDims& d, ScalarType dtype, const AttributeValue* a) {
    if (!Available()) {
      return std::string(P::kName) +
             " runs on the GPU through the Triton kernels, and this native library embeds none (build it with "
             "KERAS_YOSO_TRITON_CUBINS, docs/build.md)";
    }
    return CheckTriton<P>(d, dtype, a);
  }
  static size_t WorkspaceBytes(const CumulationDims& d, ScalarType dtype, const AttributeValue* a) {
    return TritonWorkspaceBytes<P>(d, dtype, a);
  }
  static std::string Run(const CumulationDims& d, ScalarType dtype, const AttributeValue* a, const TensorRef* in,
                         const TensorRef* out, void* workspace, size_t bytes, cudaStream_t stream) {
    bool ran = false;
    const std::string error = RunTriton<P>(d, dtype, a, in, out, workspace, bytes, stream, &ran);
    if (ran || !error.empty()) return error;
    return std::string(P::kName) +
           ": no embedded Triton cubin runs on this GPU (they are built for sm_80 (8.x) and sm_90a (9.0))";
  }
};

// eq. 4 in one pass (K1, K6, K7): fp32 atomics into the accumulators, or the deterministic mode.
template <>
struct GpuRun<LowerBoundGradients> : TritonOnlyGpuRun<LowerBoundGradients, false, true> {};

// The decoding step: every element summed in a fixed order.
template <>
struct GpuRun<LshCumulationStep> : TritonOnlyGpuRun<LshCumulationStep, true> {};

template <>
struct GpuRun<WeightedLshCumulation> : GpuRunDefaults {
  static constexpr bool kDeterministic = false;
  static std::string Check(const CumulationDims&, ScalarType, const AttributeValue* a) {
    return CheckGpuCausal(WeightedLshCumulation::kName, a[1].int_value);
  }
  static size_t WorkspaceBytes(const CumulationDims& d, ScalarType, const AttributeValue*) {
    return WeightedLshCumulationWorkspaceBytes(d);
  }
  static std::string Run(const CumulationDims& d, ScalarType dtype, const AttributeValue*, const TensorRef* in,
                         const TensorRef* out, void* workspace, size_t bytes, cudaStream_t stream) {
    return CudaErrorText(WeightedLshCumulationGpu(d, dtype, In<float>(in[0]), In<int32_t>(in[1]), in[2].data, In<float>(in[3]),
                                    In<int32_t>(in[4]), in[5].data, in[6].data, out[0].data, workspace, bytes,
                                    stream));
  }
};

template <>
struct GpuRun<CollisionCumulation> : GpuRunDefaults {
  static size_t WorkspaceBytes(const CumulationDims& d, ScalarType, const AttributeValue*) {
    return CollisionCumulationWorkspaceBytes(d);
  }
  static std::string Run(const CumulationDims& d, ScalarType dtype, const AttributeValue* a, const TensorRef* in,
                         const TensorRef* out, void* workspace, size_t bytes, cudaStream_t stream) {
    return CudaErrorText(CollisionCumulationGpu(d, dtype, static_cast<int>(a[0].int_value), CollisionCumulation::Epsilon(a),
                                  In<float>(in[0]), In<int32_t>(in[1]), in[2].data, in[3].data, In<float>(in[4]),
                                  In<int32_t>(in[5]), in[6].data, in[7].data, out[0].data, workspace, bytes, stream));
  }
};

// Every primitive with a CUDA kernel: X(name, struct), a sublist of KY_PRIMITIVES. _spec.py's rows
// of these names list "gpu" in their devices.
#define KY_GPU_PRIMITIVES(X)                                       \
  X(gaussian_hash_codes, GaussianHashCodes)                        \
  X(hadamard_hash_codes, HadamardHashCodes)                        \
  X(hadamard_interleaved_hash_codes, HadamardInterleavedHashCodes) \
  X(lsh_cumulation, LshCumulation)                                 \
  X(lsh_cumulation_step, LshCumulationStep)                        \
  X(weighted_lsh_cumulation, WeightedLshCumulation)                \
  X(lower_bound_gradients, LowerBoundGradients)                    \
  X(collision_cumulation, CollisionCumulation)

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_YOSO_GPU_PRIMITIVES_H_
