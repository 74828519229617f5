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

// Set on a thread (ScopedTritonDeterministic) for the calls it makes: TensorFlow's GPU kernels do so
// under op determinism.
inline bool& TritonDeterministicOnThisThread() {
  thread_local bool deterministic = false;
  return deterministic;
}

class ScopedTritonDeterministic {
 public:
  ScopedTritonDeterministic() : was_(TritonDeterministicOnThisThread()) { TritonDeterministicOnThisThread() = true; }
  ~ScopedTritonDeterministic() { TritonDeterministicOnThisThread() = was_; }

 private:
  bool was_;
};

inline bool EnvironmentFlag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// The options of the calls made now, read at each call: fp32 rows of the eq. 4 kernels take exact
// IEEE products unless KERAS_YOSO_GPU_TF32=1 (TF32 tensor cores with fp32 accumulation,
// GPU-DESIGN.md §2.4: about 2e-3 relative; PyTorch's matmuls default to no TF32 too); the eq. 4
// kernels run their deterministic mode under KERAS_YOSO_GPU_DETERMINISTIC=1 or on a thread that
// asks for it (ScopedTritonDeterministic).
inline TritonOptions TritonOptionsNow() {
  TritonOptions options;
  options.exact_fp32 = !EnvironmentFlag("KERAS_YOSO_GPU_TF32");
  options.deterministic = EnvironmentFlag("KERAS_YOSO_GPU_DETERMINISTIC") || TritonDeterministicOnThisThread();
  return options;
}

// TritonPlanOf<P>::Plan(d, dtype, attributes, arch, options, plan): "" and the plan, or why the Triton
// kernels cannot take the call.
template <typename P>
struct TritonPlanOf {
  static constexpr bool kExists = false;
};

template <>
struct TritonPlanOf<LshCumulation> {
  static constexpr bool kExists = true;
  static std::string Plan(const CumulationDims& d, ScalarType dtype, const AttributeValue* a, int arch,
                          const TritonOptions& options, TritonPlan* plan) {
    return PlanLshCumulation(d, dtype, arch, a[1].int_value, options, plan);
  }
};

template <>
struct TritonPlanOf<LshCumulationStep> {
  static constexpr bool kExists = true;
  static std::string Plan(const CumulationDims& d, ScalarType dtype, const AttributeValue*, int arch,
                          const TritonOptions&, TritonPlan* plan) {
    return PlanLshCumulationStep(d, dtype, arch, plan);
  }
};

template <>
struct TritonPlanOf<LowerBoundGradients> {
  static constexpr bool kExists = true;
  static std::string Plan(const CumulationDims& d, ScalarType dtype, const AttributeValue* a, int arch,
                          const TritonOptions& options, TritonPlan* plan) {
    return PlanLowerBoundGradients(d, dtype, arch, a[1].int_value, options, plan);
  }
};

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_TRITON_PRIMITIVES_H_
