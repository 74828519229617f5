// The GPU entries of the C ABI (yoso_c_api.h): ky_device_kernels, ky_has_device_kernel,
// ky_device_workspace_bytes and ky_run_device. They check a call exactly as ky_run does
// (primitive_call.h), count the codes outside [0, num_buckets) on the device, then run the
// primitive's GPU kernel (GpuRun<P> of yoso_gpu_primitives.h) on the caller's stream with the
// caller's workspace. Generic over KY_GPU_PRIMITIVES: no per-primitive code.
//
// Built with KY_WITH_CUDA=1 (setup.py, when nvcc is found) next to the CUDA kernels and the static
// CUDA runtime, which opens libcuda only at the first CUDA call: the library loads on machines
// without a GPU or driver, and ky_run_device then fails with the runtime's message. Built without
// it, the entries exist and say that the library holds no CUDA kernels.
#include <stdexcept>
#include <string>
#include <type_traits>

#include "primitive_call.h"
#include "triton_primitives.h"
#include "yoso_c_api.h"
#include "yoso_primitives.h"

#ifndef KY_WITH_CUDA
#define KY_WITH_CUDA 0
#endif
#if KY_WITH_CUDA
#include <cuda_runtime_api.h>

#include "yoso_gpu_primitives.h"
#endif

namespace keras_yoso {
namespace {

using namespace c_api;  // NOLINT: this file is the GPU half of the C ABI

#if KY_WITH_CUDA
// The device counter of invalid codes lies at the start of the workspace; the primitive's own
// scratch follows at this offset (aligned for any launcher's use).
constexpr size_t kCodeCounterBytes = 256;

template <typename P>
constexpr bool HasGpuRun() {
#define KY_IS_GPU_PRIMITIVE(name, Q) std::is_same_v<P, Q> ||
  return KY_GPU_PRIMITIVES(KY_IS_GPU_PRIMITIVE) false;
#undef KY_IS_GPU_PRIMITIVE
}

void ThrowOnCudaError(cudaError_t status, const char* primitive, const char* what) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string(primitive) + " on the GPU: " + what + " failed: " +
                           cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

// The number of codes outside [0, num_buckets) in the device tensor `codes`, counted on `stream`
// into the workspace's counter and read back (the stream is synchronized).
int64_t CountInvalidCodesOnDevice(const char* primitive, const TensorRef& codes, int64_t num_buckets,
                                  void* workspace, cudaStream_t stream) {
  auto* counter = static_cast<unsigned long long*>(workspace);
  unsigned long long host = 0;
  ThrowOnCudaError(CountInvalidCodesGpu(In<int32_t>(codes), ElementCount(codes.shape), num_buckets, counter, stream),
                   primitive, "counting invalid codes");
  ThrowOnCudaError(cudaMemcpyAsync(&host, counter, sizeof(host), cudaMemcpyDeviceToHost, stream), primitive,
                   "reading the invalid-code count");
  ThrowOnCudaError(cudaStreamSynchronize(stream), primitive, "synchronizing the stream");
  return static_cast<int64_t>(host);
}

template <typename P>
size_t WorkspaceBytes(const PrimitiveCall<P>& call) {
  return kCodeCounterBytes +
         GpuRun<P>::WorkspaceBytes(call.dims, static_cast<ScalarType>(call.dtype), call.attributes.data());
}

// Checks and runs primitive P on the GPU: the call, the GPU kernel's own limits, the workspace size,
// the codes (on the device), the outputs; then GpuRun<P>::Run unless every output is empty.
template <typename P>
std::string RunOnDevice(const KyTensor* inputs, int32_t num_inputs, const KyAttribute* attributes,
                        int32_t num_attributes, KyTensor* outputs, int32_t num_outputs, void* workspace,
                        int64_t workspace_bytes, void* stream_handle) {
  if constexpr (!HasGpuRun<P>()) {
    return std::string(P::kName) + " has no GPU kernel (it runs on the CPU: ky_run)";
  } else {
    PrimitiveCall<P> call;
    std::string e = PreparePrimitive<P>(inputs, num_inputs, attributes, num_attributes, &num_outputs, &call);
    if (e.empty()) e = GpuRun<P>::Check(call.dims, static_cast<ScalarType>(call.dtype), call.attributes.data());
    if (!e.empty()) return e;
    const size_t needed = WorkspaceBytes(call);
    if (workspace == nullptr || workspace_bytes < 0 || static_cast<size_t>(workspace_bytes) < needed) {
      return std::string(P::kName) + " needs a device workspace of " + std::to_string(needed) +
             " bytes (ky_device_workspace_bytes), got " + std::to_string(workspace_bytes) + " bytes at " +
             (workspace == nullptr ? "a null pointer" : "a device pointer");
    }
    auto stream = static_cast<cudaStream_t>(stream_handle);
    for (size_t i = 0; i < P::kInputs.size() && e.empty(); ++i) {
      if (P::kInputs[i].kind != Kind::kCodes || ElementCount(call.in[i].shape) == 0) continue;
      const int64_t invalid =
          CountInvalidCodesOnDevice(P::kName, call.in[i], CodeBound(call.dims), workspace, stream);
      e = InvalidCodesMessage(P::kInputs[i].name, invalid, CodeBound(call.dims));
    }
    if (e.empty()) e = PrepareOutputs<P>(outputs, &call);
    if (!e.empty() || !call.work) return e;
    e = GpuRun<P>::Run(call.dims, static_cast<ScalarType>(call.dtype), call.attributes.data(), call.in.data(),
                       call.out.data(), static_cast<char*>(workspace) + kCodeCounterBytes,
                       needed - kCodeCounterBytes, stream);
    if (!e.empty()) throw std::runtime_error(std::string(P::kName) + " on the GPU: launching its kernels failed: " + e);
    return "";
  }
}

template <typename P>
std::string DeviceWorkspaceBytes(const KyTensor* inputs, int32_t num_inputs, const KyAttribute* attributes,
                                 int32_t num_attributes, int64_t* bytes) {
  if constexpr (!HasGpuRun<P>()) {
    return std::string(P::kName) + " has no GPU kernel (it runs on the CPU: ky_run)";
  } else {
    PrimitiveCall<P> call;
    std::string e = PreparePrimitive<P>(inputs, num_inputs, attributes, num_attributes, nullptr, &call);
    if (e.empty()) e = GpuRun<P>::Check(call.dims, static_cast<ScalarType>(call.dtype), call.attributes.data());
    if (e.empty()) *bytes = static_cast<int64_t>(WorkspaceBytes(call));
    return e;
  }
}
#endif  // KY_WITH_CUDA

// The Triton launch plan of P for cubins of `arch`, as JSON (triton_launch.h).
template <typename P>
std::string DeviceLaunchPlan(const KyTensor* inputs, int32_t num_inputs, const KyAttribute* attributes,
                             int32_t num_attributes, int32_t arch, const TritonOptions& options, std::string* json) {
  if constexpr (!TritonPlanOf<P>::kExists) {
    return std::string(P::kName) + " has no Triton kernels (they run lsh_cumulation and lower_bound_gradients)";
  } else {
    PrimitiveCall<P> call;
    std::string e = PreparePrimitive<P>(inputs, num_inputs, attributes, num_attributes, nullptr, &call);
    if (e.empty() && arch != 80 && arch != 90) e = "arch must be 80 or 90 (the built cubins), got " + std::to_string(arch);
    TritonPlan plan;
    if (e.empty()) {
      e = TritonPlanOf<P>::Plan(call.dims, static_cast<ScalarType>(call.dtype), call.attributes.data(), arch,
                                options, &plan);
    }
    if (e.empty()) *json = TritonPlanJson(plan);
    return e;
  }
}

#if !KY_WITH_CUDA
[[noreturn]] void ThrowNoCudaKernels() {
  throw std::runtime_error(
      "this keras_yoso native library holds no CUDA kernels (it was built without nvcc; rebuild it with the CUDA "
      "toolkit on the PATH, docs/build.md)");
}
#endif  // KY_WITH_CUDA

}  // namespace
}  // namespace keras_yoso

using namespace keras_yoso;  // NOLINT: the extern "C" entries below only forward

#ifndef KY_CUDA_ARCHS
#define KY_CUDA_ARCHS "none"
#endif
#if KY_WITH_CUDA
#define KY_STRINGIFY(x) #x
#define KY_VERSION_TEXT(x) KY_STRINGIFY(x)
#define KY_CUDA_TEXT "CUDA runtime " KY_VERSION_TEXT(CUDART_VERSION) " (static), SM " KY_CUDA_ARCHS
#else
#define KY_CUDA_TEXT "no CUDA kernels"
#endif

extern "C" {

const char* ky_build_info(void) { return "compiler " __VERSION__ "; " KY_CUDA_TEXT; }

int32_t ky_device_kernels(void) { return KY_WITH_CUDA ? 1 : 0; }

int32_t ky_triton_cubins(void) { return kTritonCubinCount; }

int32_t ky_device_launch_plan(const char* primitive, const KyTensor* inputs, int32_t num_inputs,
                              const KyAttribute* attributes, int32_t num_attributes, int32_t arch, int32_t options,
                              char* plan, int64_t plan_size, char* error, int64_t error_size) {
  return c_api::Guarded(error, error_size, [&]() -> std::string {
    if (plan == nullptr || plan_size < 1) return "ky_device_launch_plan: plan must hold at least 1 byte";
    plan[0] = '\0';
    std::string json;
    const std::string e = c_api::ForPrimitiveNamed(primitive, [&](auto p) {
      TritonOptions chosen;
      chosen.exact_fp32 = (options & KY_PLAN_EXACT_FP32) != 0;
      chosen.deterministic = (options & KY_PLAN_DETERMINISTIC) != 0;
      return DeviceLaunchPlan<decltype(p)>(inputs, num_inputs, attributes, num_attributes, arch, chosen, &json);
    });
    if (!e.empty()) return e;
    if (static_cast<int64_t>(json.size()) >= plan_size) {
      throw std::length_error("the launch plan takes " + std::to_string(json.size() + 1) + " bytes, plan_size is " +
                              std::to_string(plan_size));
    }
    json.copy(plan, json.size());
    plan[json.size()] = '\0';
    return "";
  });
}

int32_t ky_has_device_kernel(const char* primitive) {
#if KY_WITH_CUDA
  const std::string name = primitive == nullptr ? "" : primitive;
#define KY_IS_NAMED(primitive_name, P) \
  if (name == P::kName) return GpuRun<P>::Available() ? 1 : 0;
  KY_GPU_PRIMITIVES(KY_IS_NAMED)
#undef KY_IS_NAMED
#endif
  (void)primitive;
  return 0;
}

int32_t ky_device_workspace_bytes(const char* primitive, const KyTensor* inputs, int32_t num_inputs,
                                  const KyAttribute* attributes, int32_t num_attributes, int64_t* bytes, char* error,
                                  int64_t error_size) {
  return c_api::Guarded(error, error_size, [&]() -> std::string {
    if (bytes == nullptr) return "ky_device_workspace_bytes: bytes must not be null";
    *bytes = 0;
#if KY_WITH_CUDA
    return c_api::ForPrimitiveNamed(primitive, [&](auto p) {
      return DeviceWorkspaceBytes<decltype(p)>(inputs, num_inputs, attributes, num_attributes, bytes);
    });
#else
    (void)primitive, (void)inputs, (void)num_inputs, (void)attributes, (void)num_attributes;
    ThrowNoCudaKernels();
#endif
  });
}

int32_t ky_run_device(const char* primitive, const KyTensor* inputs, int32_t num_inputs,
                      const KyAttribute* attributes, int32_t num_attributes, KyTensor* outputs, int32_t num_outputs,
                      void* workspace, int64_t workspace_bytes, void* stream, char* error, int64_t error_size) {
  return c_api::Guarded(error, error_size, [&]() -> std::string {
#if KY_WITH_CUDA
    return c_api::ForPrimitiveNamed(primitive, [&](auto p) {
      return RunOnDevice<decltype(p)>(inputs, num_inputs, attributes, num_attributes, outputs, num_outputs,
                                      workspace, workspace_bytes, stream);
    });
#else
    (void)primitive, (void)inputs, (void)num_inputs, (void)attributes, (void)num_attributes, (void)outputs;
    (void)num_outputs, (void)workspace, (void)workspace_bytes, (void)stream;
    ThrowNoCudaKernels();
#endif
  });
}

}  // extern "C"
