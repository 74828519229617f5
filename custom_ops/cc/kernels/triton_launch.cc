// The driver-API launcher of the Triton cubins (triton_launch.h). No CUDA header: the few driver
// entries it needs are declared here and looked up in libcuda.so.1, opened at the first GPU call,
// so this file builds everywhere and a library without a GPU or driver still loads. Nothing here
// exits or aborts: every failure is a message.
#include "triton_launch.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>

namespace keras_yoso {
namespace {

// The driver API's types and the constants used here (cuda.h, CUDA 12 / 13).
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;  // NOLINT: the driver's type
constexpr CUresult kSuccess = 0;
constexpr int kComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr int kMaxDynamicSharedBytes = 8;    // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kDefaultSharedLimit = 48 * 1024;

struct Driver {
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*StreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*CtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*CtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*CtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*FuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) = nullptr;
  std::string error;  // why the driver is unusable ("" when it is)
};

template <typename F>
bool Bind(void* handle, const char* name, F* f, std::string* error) {
  *f = reinterpret_cast<F>(dlsym(handle, name));
  if (*f == nullptr && error->empty()) error->assign(std::string("libcuda.so.1 has no ") + name);
  return *f != nullptr;
}

const Driver& GetDriver() {
  static const Driver* driver = [] {
    auto* d = new Driver;
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      d->error = std::string("cannot open the CUDA driver libcuda.so.1: ") + (why ? why : "unknown error");
      return d;
    }
    std::string& e = d->error;
    Bind(handle, "cuGetErrorString", &d->GetErrorString, &e);
    Bind(handle, "cuStreamGetCtx", &d->StreamGetCtx, &e);
    Bind(handle, "cuCtxPushCurrent_v2", &d->CtxPushCurrent, &e);
    Bind(handle, "cuCtxPopCurrent_v2", &d->CtxPopCurrent, &e);
    Bind(handle, "cuCtxGetDevice", &d->CtxGetDevice, &e);
    Bind(handle, "cuDeviceGetAttribute", &d->DeviceGetAttribute, &e);
    Bind(handle, "cuModuleLoadData", &d->ModuleLoadData, &e);
    Bind(handle, "cuModuleGetFunction", &d->ModuleGetFunction, &e);
    Bind(handle, "cuFuncSetAttribute", &d->FuncSetAttribute, &e);
    Bind(handle, "cuMemsetD8Async", &d->MemsetD8Async, &e);
    Bind(handle, "cuMemcpyDtoDAsync_v2", &d->MemcpyDtoDAsync, &e);
    Bind(handle, "cuLaunchKernel", &d->LaunchKernel, &e);
    return d;
  }();
  return *driver;
}

std::string DriverError(const Driver& driver, CUresult status, const std::string& what) {
  const char* text = nullptr;
  if (driver.GetErrorString == nullptr || driver.GetErrorString(status, &text) != kSuccess || text == nullptr) {
    text = "unknown error";
  }
  return what + " failed: CUDA driver error " + std::to_string(status) + " (" + text + ")";
}

// The context `stream` belongs to, made current for the scope (popped on exit).
class ScopedStreamContext {
 public:
  ScopedStreamContext(const Driver& driver, CUstream stream, std::string* error) : driver_(driver) {
    CUresult status = driver.StreamGetCtx(stream, &context_);
    if (status != kSuccess) {
      *error = DriverError(driver, status, "cuStreamGetCtx (the stream's CUDA context)");
      return;
    }
    status = driver.CtxPushCurrent(context_);
    if (status != kSuccess) {
      *error = DriverError(driver, status, "cuCtxPushCurrent");
      return;
    }
    pushed_ = true;
  }
  ~ScopedStreamContext() {
    CUcontext popped = nullptr;
    if (pushed_) driver_.CtxPopCurrent(&popped);
  }
  CUcontext context() const { return context_; }

 private:
  const Driver& driver_;
  CUcontext context_ = nullptr;
  bool pushed_ = false;
};

const TritonCubin* FindCubin(const TritonVariant& v) {
  for (int i = 0; i < kTritonCubinCount; ++i) {
    if (kTritonCubins[i].arch == v.arch && std::strcmp(kTritonCubins[i].variant, v.name) == 0) {
      return &kTritonCubins[i];
    }
  }
  return nullptr;
}

// The loaded function of a cubin in a context, loaded (and its shared-memory limit raised) once.
std::string GetFunction(const Driver& driver, CUcontext context, const TritonCubin& cubin, CUfunction* function) {
  struct Loaded {
    CUcontext context;
    const TritonCubin* cubin;
    CUfunction function;
  };
  static std::mutex mutex;
  static std::vector<Loaded>* loaded = new std::vector<Loaded>;
  std::lock_guard<std::mutex> lock(mutex);
  for (const Loaded& l : *loaded) {
    if (l.context == context && l.cubin == &cubin) {
      *function = l.function;
      return "";
    }
  }
  CUmodule module = nullptr;
  CUresult status = driver.ModuleLoadData(&module, cubin.data);
  if (status != kSuccess) {
    return DriverError(driver, status, std::string("cuModuleLoadData of ") + cubin.variant + " (sm_" +
                                           std::to_string(cubin.arch) + ")");
  }
  status = driver.ModuleGetFunction(function, module, cubin.function);
  if (status != kSuccess) return DriverError(driver, status, std::string("cuModuleGetFunction ") + cubin.function);
  if (cubin.shared_bytes > kDefaultSharedLimit) {
    status = driver.FuncSetAttribute(*function, kMaxDynamicSharedBytes, cubin.shared_bytes);
    if (status != kSuccess) {
      return DriverError(driver, status, std::string("raising the shared memory of ") + cubin.variant + " to " +
                                             std::to_string(cubin.shared_bytes) + " bytes");
    }
  }
  loaded->push_back({context, &cubin, *function});
  return "";
}

void AppendArg(const PlanArg& a, std::string* out) {
  char number[64];
  switch (a.kind) {
    case PlanArg::kInput: *out += "[\"in\", " + std::to_string(a.value) + "]"; break;
    case PlanArg::kOutput: *out += "[\"out\", " + std::to_string(a.value) + "]"; break;
    case PlanArg::kWorkspace: *out += "[\"ws\", " + std::to_string(a.value) + "]"; break;
    case PlanArg::kInt32: *out += "[\"i32\", " + std::to_string(a.value) + "]"; break;
    case PlanArg::kFloat32:
      std::snprintf(number, sizeof(number), "%.9g", static_cast<double>(a.real));
      *out += std::string("[\"fp32\", ") + number + "]";
      break;
    case PlanArg::kNull: *out += "[\"null\", 0]"; break;
  }
}

}  // namespace

std::string TritonPlanJson(const TritonPlan& plan) {
  std::string out = "{\"workspace_bytes\": " + std::to_string(plan.workspace_bytes) + ", \"copies\": [";
  for (size_t i = 0; i < plan.copies.size(); ++i) {
    out += (i ? ", [" : "[") + std::to_string(plan.copies[i].input) + ", " + std::to_string(plan.copies[i].output) +
           ", " + std::to_string(plan.copies[i].bytes) + "]";
  }
  out += "], \"zeroed\": [";
  for (size_t i = 0; i < plan.zeroed.size(); ++i) {
    out += (i ? ", [" : "[") + std::to_string(plan.zeroed[i].first) + ", " + std::to_string(plan.zeroed[i].second) +
           "]";
  }
  out += "], \"launches\": [";
  for (size_t i = 0; i < plan.launches.size(); ++i) {
    const PlanLaunch& l = plan.launches[i];
    out += std::string(i ? ", " : "") + "{\"variant\": \"" + l.variant->name + "\", \"arch\": " +
           std::to_string(l.variant->arch) + ", \"num_warps\": " + std::to_string(l.variant->num_warps) +
           ", \"grid\": [" + std::to_string(l.grid[0]) + ", " + std::to_string(l.grid[1]) + ", " +
           std::to_string(l.grid[2]) + "], \"args\": [";
    for (size_t j = 0; j < l.args.size(); ++j) {
      if (j) out += ", ";
      AppendArg(l.args[j], &out);
    }
    out += "]}";
  }
  return out + "]}";
}

int TritonArchOfStream(void* stream, std::string* error) {
  if (!TritonCubinsEmbedded()) return 0;
  const Driver& driver = GetDriver();
  if (!driver.error.empty()) {
    *error = driver.error;
    return 0;
  }
  ScopedStreamContext scope(driver, stream, error);
  if (!error->empty()) return 0;
  CUdevice device = 0;
  int major = 0, minor = 0;
  CUresult status = driver.CtxGetDevice(&device);
  if (status == kSuccess) status = driver.DeviceGetAttribute(&major, kComputeCapabilityMajor, device);
  if (status == kSuccess) status = driver.DeviceGetAttribute(&minor, kComputeCapabilityMinor, device);
  if (status != kSuccess) {
    *error = DriverError(driver, status, "reading the device's compute capability");
    return 0;
  }
  const int arch = TritonArchOf(major, minor);
  for (int i = 0; i < kTritonCubinCount; ++i) {
    if (kTritonCubins[i].arch == arch) return arch;
  }
  return 0;
}

std::string RunTritonPlan(const TritonPlan& plan, void* const* in, void* const* out, void* workspace,
                          void* stream) {
  const Driver& driver = GetDriver();
  if (!driver.error.empty()) return driver.error;
  std::string error;
  ScopedStreamContext scope(driver, stream, &error);
  if (!error.empty()) return error;
  for (const PlanCopy& copy : plan.copies) {
    if (in[copy.input] == out[copy.output] || copy.bytes == 0) continue;
    const CUresult status =
        driver.MemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(out[copy.output]),
                               reinterpret_cast<CUdeviceptr>(in[copy.input]), static_cast<size_t>(copy.bytes), stream);
    if (status != kSuccess) return DriverError(driver, status, "copying input " + std::to_string(copy.input) +
                                                                   " into output " + std::to_string(copy.output));
  }
  auto* base = static_cast<char*>(workspace);
  for (const auto& [offset, bytes] : plan.zeroed) {
    const CUresult status = driver.MemsetD8Async(reinterpret_cast<CUdeviceptr>(base + offset), 0,
                                                 static_cast<size_t>(bytes), stream);
    if (status != kSuccess) return DriverError(driver, status, "zeroing the Triton accumulators");
  }
  for (const PlanLaunch& launch : plan.launches) {
    const TritonCubin* cubin = FindCubin(*launch.variant);
    if (cubin == nullptr) {
      return std::string("this keras_yoso native library embeds no cubin of ") + launch.variant->name + " for sm_" +
             std::to_string(launch.variant->arch);
    }
    CUfunction function = nullptr;
    error = GetFunction(driver, scope.context(), *cubin, &function);
    if (!error.empty()) return error;
    // One 8-byte slot per parameter; kernelParams[i] points at the value of parameter i.
    std::vector<unsigned long long> slots(launch.args.size(), 0);  // NOLINT: the driver's pointer width
    std::vector<void*> params(launch.args.size());
    for (size_t i = 0; i < launch.args.size(); ++i) {
      const PlanArg& a = launch.args[i];
      void* pointer = nullptr;
      switch (a.kind) {
        case PlanArg::kInput: pointer = in[a.value]; break;
        case PlanArg::kOutput: pointer = out[a.value]; break;
        case PlanArg::kWorkspace: pointer = base + a.value; break;
        case PlanArg::kInt32: {
          const int32_t v = static_cast<int32_t>(a.value);
          std::memcpy(&slots[i], &v, sizeof(v));
          break;
        }
        case PlanArg::kFloat32: std::memcpy(&slots[i], &a.real, sizeof(a.real)); break;
        case PlanArg::kNull: break;
      }
      if (pointer != nullptr) slots[i] = reinterpret_cast<CUdeviceptr>(pointer);
      params[i] = &slots[i];
    }
    const CUresult status = driver.LaunchKernel(
        function, static_cast<unsigned>(launch.grid[0]), static_cast<unsigned>(launch.grid[1]),
        static_cast<unsigned>(launch.grid[2]), static_cast<unsigned>(launch.variant->num_warps * 32), 1, 1,
        static_cast<unsigned>(cubin->shared_bytes), stream, params.data(), nullptr);
    if (status != kSuccess) return DriverError(driver, status, std::string("launching ") + launch.variant->name);
  }
  return "";
}

}  // namespace keras_yoso
