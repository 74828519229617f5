// Which primitives of yoso_primitives.h the Triton kernels run, and their launch plans
// (triton_launch.h): TritonPlanOf<P>::Plan fills a plan for a call that Check accepted, or says why
// the Triton kernels cannot take it. Plain C++ (no CUDA header): the C ABI's ky_device_launch_plan
// uses it in every build, GpuRun<P> (yoso_gpu_primitives.h) where the CUDA kernels are built.
#ifndef KERAS_YOSO_KERNELS_TRITON_PRIMITIVES_H_
#define KERAS_YOSO_KERNELS_TRITON_PRIMITIVES_H_

#include <cstdlib>
#include <cstring>
#include <string>

#include "triton_launch.h"
#include "yoso_primitives.h"

namespace keras_yoso {

// fp32 rows of the eq. 4 kernels: exact IEEE products by default (as PyTorch's matmuls default to
// no TF32); KERAS_YOSO_GPU_TF32=1 takes TF32 tensor-core products with fp32 accumulation
// (GPU-DESIGN.md §2.4: about 2e-3 relative), read at each call.
inline bool TritonExactFp32() {
  const char* tf32 = std::getenv("KERAS_YOSO_GPU_TF32");
  return tf32 == nullptr || std::strcmp(tf32, "1") != 0;
}

inline std::string CheckTritonCausal(const char* primitive, int64_t causal) {
  if (causal == 0) return "";
  return std::string(primitive) + " has no Triton kernel for causal = " + std::to_string(causal);
}

template <typename P>
struct TritonPlanOf {
  static constexpr bool kExists = false;
};

template <>
struct TritonPlanOf<LshCumulation> {
  static constexpr bool kExists = true;
  static std::string Plan(const CumulationDims& d, ScalarType dtype, const AttributeValue* a, int arch, bool,
                          TritonPlan* plan) {
    const std::string error = CheckTritonCausal(LshCumulation::kName, a[1].int_value);
    return error.empty() ? PlanLshCumulation(d, dtype, arch, plan) : error;
  }
};

template <>
struct TritonPlanOf<LshCumulationStep> {
  static constexpr bool kExists = true;
  static std::string Plan(const CumulationDims& d, ScalarType dtype, const AttributeValue*, int arch, bool,
                          TritonPlan* plan) {
    return PlanLshCumulationStep(d, dtype, arch, plan);
  }
};

template <>
struct TritonPlanOf<LowerBoundGradients> {
  static constexpr bool kExists = true;
  static std::string Plan(const CumulationDims& d, ScalarType dtype, const AttributeValue* a, int arch,
                          bool exact_fp32, TritonPlan* plan) {
    const std::string error = CheckTritonCausal(LowerBoundGradients::kName, a[1].int_value);
    return error.empty() ? PlanLowerBoundGradients(d, dtype, arch, exact_fp32, plan) : error;
  }
};

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_TRITON_PRIMITIVES_H_
