// TensorFlow OpKernels of keras-yoso, generic over the primitives of yoso_primitives.h:
// PrimitiveOp<Device, P, T> reads P's attributes, runs P::Check on the input shapes, checks the
// codes, allocates the outputs, then runs P::Run on TF's CPU worker pool, or on a GPU GpuRun<P>::Run
// of yoso_gpu_primitives.h (the kernels floor's GPU run, which the C ABI's ky_run_device runs too)
// on TF's stream with a workspace from TF's allocator. No math and no per-primitive code lives here
// but the registrations.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tf_status.h"
#include "yoso_primitives.h"
#if GOOGLE_CUDA
#include "tensorflow/core/util/determinism.h"
#include "yoso_gpu_primitives.h"
#endif

namespace keras_yoso {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using CPUDevice = Eigen::ThreadPoolDevice;
#if GOOGLE_CUDA
using ::tensorflow::DEVICE_GPU;
using GPUDevice = Eigen::GpuDevice;
#endif

namespace {

// Runs yoso_cpu.h's work units on the op's intra-op thread pool.
struct TfParallelFor {
  OpKernelContext* ctx;
  void operator()(int64_t units, int64_t cost_per_unit,
                  const std::function<void(int64_t, int64_t)>& fn) const {
    if (units <= 0) return;
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(units, cost_per_unit, fn);
  }
};

// The shapes of P's inputs for its Check.
template <typename P>
Status InputShapes(OpKernelContext* ctx, Shape* shapes) {
  for (size_t i = 0; i < P::kInputs.size(); ++i) {
    const Tensor& t = ctx->input(static_cast<int>(i));
    if (t.dims() > kMaxCheckedRank) {
      return absl::InvalidArgumentError(RankTooHighMessage(P::kInputs[i].name, t.dims()));
    }
    shapes[i].rank = t.dims();
    for (int axis = 0; axis < t.dims(); ++axis) shapes[i].dims[axis] = t.dim_size(axis);
  }
  return absl::OkStatus();
}

// Allocates output `index` (spec) with `shape`, forwarding the input it updates in place when
// nothing else holds that input; InvalidArgumentError when its element count overflows int64 (a
// huge dimension of an empty input can reach an output, e.g. value [1, 0, 2^62] with 4 queries).
Status AllocateOutput(OpKernelContext* ctx, int index, const OutputSpec& spec, const Shape& shape, Tensor** out) {
  TensorShape tf_shape;
  if (!TensorShape::BuildTensorShape(absl::Span<const int64_t>(shape.dims, shape.rank), &tf_shape).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", spec.name, " ", spec.meaning, " = ", ShapeText(shape),
                                                   " would have more than 2**63 - 1 elements"));
  }
  if (spec.in_place_of >= 0) {
    return ctx->forward_input_or_allocate_output({spec.in_place_of}, index, tf_shape, out);
  }
  return ctx->allocate_output(index, tf_shape, out);
}

template <typename Device>
struct CodeValidator;

template <>
struct CodeValidator<CPUDevice> {
  static int64_t CountInvalid(OpKernelContext*, const Tensor& codes, int64_t num_buckets) {
    return CountInvalidCodes(codes.flat<int32_t>().data(), codes.NumElements(), num_buckets);
  }
};

// Rejects codes outside [0, num_buckets), naming the input.
template <typename Device>
Status CheckCodes(OpKernelContext* ctx, const Tensor& codes, const char* name,
                  int64_t num_buckets) {
  if (codes.NumElements() == 0) return absl::OkStatus();
  const int64_t invalid = CodeValidator<Device>::CountInvalid(ctx, codes, num_buckets);
  if (invalid < 0) return absl::InternalError(absl::StrCat("could not validate ", name));
  return Invalid(InvalidCodesMessage(name, invalid, num_buckets));
}

#if GOOGLE_CUDA
template <typename T>
constexpr ScalarType ScalarTypeOf();
template <>
constexpr ScalarType ScalarTypeOf<float>() { return ScalarType::kFloat32; }
template <>
constexpr ScalarType ScalarTypeOf<Eigen::half>() { return ScalarType::kFloat16; }
template <>
constexpr ScalarType ScalarTypeOf<Eigen::bfloat16>() { return ScalarType::kBFloat16; }

cudaStream_t StreamOf(OpKernelContext* ctx) { return ctx->eigen_device<GPUDevice>().stream(); }

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed: ", cudaGetErrorString(err)));
}

template <>
struct CodeValidator<GPUDevice> {
  static int64_t CountInvalid(OpKernelContext* ctx, const Tensor& codes, int64_t num_buckets) {
    Tensor count;
    if (!ctx->allocate_temp(tensorflow::DT_UINT64, TensorShape({1}), &count).ok()) return -1;
    unsigned long long host = 0;
    auto* device_count = reinterpret_cast<unsigned long long*>(count.flat<tensorflow::uint64>().data());
    cudaStream_t stream = StreamOf(ctx);
    if (CountInvalidCodesGpu(codes.flat<int32_t>().data(), codes.NumElements(), num_buckets,
                             device_count, stream) != cudaSuccess ||
        cudaMemcpyAsync(&host, device_count, sizeof(host), cudaMemcpyDeviceToHost, stream) !=
            cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      return -1;
    }
    return static_cast<int64_t>(host);
  }
};

// The GPU table cumulations add values into their buckets with float atomics, so their
// rounding depends on thread scheduling. Like TensorFlow's own kernels of that kind, they
// refuse to run when op determinism is enabled (tf.config.experimental.enable_op_determinism).
Status CheckNondeterminismAllowed(const char* op_name) {
  if (!tensorflow::OpDeterminismRequired()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "A deterministic GPU implementation of ", op_name,
      " is not available: it sums values into hash buckets with float atomics. Run it on CPU "
      "(bitwise reproducible), or use implementation=\"composite\"."));
}

Status AllocateWorkspace(OpKernelContext* ctx, size_t bytes, Tensor* workspace) {
  return ctx->allocate_temp(tensorflow::DT_INT8,
                            TensorShape({static_cast<int64_t>(std::max<size_t>(bytes, 1))}),
                            workspace);
}
#endif  // GOOGLE_CUDA

// The inputs and outputs of one call as TensorRefs (data pointers and shapes).
template <size_t N>
std::array<TensorRef, N> Refs(const std::array<const Tensor*, N>& tensors) {
  std::array<TensorRef, N> refs{};
  for (size_t i = 0; i < N; ++i) {
    refs[i].data = const_cast<char*>(tensors[i]->tensor_data().data());
    refs[i].shape.rank = tensors[i]->dims();
    for (int axis = 0; axis < tensors[i]->dims(); ++axis) refs[i].shape.dims[axis] = tensors[i]->dim_size(axis);
  }
  return refs;
}

// Runs primitive P on the device's kernel: the CPU kernels through P::Run; the CUDA launchers of
// yoso_gpu.h through the specializations below (a primitive without one has no GPU kernel).
template <typename Device, typename P, typename T>
struct Launch;

template <typename P, typename T>
struct Launch<CPUDevice, P, T> {
  template <size_t N, size_t M>
  static Status Run(OpKernelContext* ctx, const typename P::Dims& d, const AttributeValue* a,
                    const std::array<TensorRef, N>& in, const std::array<TensorRef, M>& out) {
    P::template Run<T>(d, a, in.data(), out.data(), TfParallelFor{ctx});
    return absl::OkStatus();
  }
};

#if GOOGLE_CUDA
// The GPU run of P (GpuRun<P>, yoso_gpu_primitives.h): its own limits, TensorFlow's determinism
// policy, a workspace from TensorFlow's allocator, the launch on TensorFlow's stream.
template <typename P, typename T>
struct Launch<GPUDevice, P, T> {
  template <size_t N, size_t M>
  static Status Run(OpKernelContext* ctx, const typename P::Dims& d, const AttributeValue* a,
                    const std::array<TensorRef, N>& in, const std::array<TensorRef, M>& out) {
    const bool deterministic_mode = GpuRun<P>::kHasDeterministicMode && tensorflow::OpDeterminismRequired();
    if (!GpuRun<P>::kDeterministic && !deterministic_mode) {
      TF_RETURN_IF_ERROR(CheckNondeterminismAllowed(P::kName));
    }
    // The mode first: Check and WorkspaceBytes plan the call with the options it runs with.
    std::optional<ScopedTritonDeterministic> deterministic;
    if (deterministic_mode) deterministic.emplace();
    TF_RETURN_IF_ERROR(Invalid(GpuRun<P>::Check(d, ScalarTypeOf<T>(), a)));
    Tensor ws;
    const size_t bytes = GpuRun<P>::WorkspaceBytes(d, ScalarTypeOf<T>(), a);
    TF_RETURN_IF_ERROR(AllocateWorkspace(ctx, bytes, &ws));
    const std::string error =
        GpuRun<P>::Run(d, ScalarTypeOf<T>(), a, in.data(), out.data(), ws.data(), bytes, StreamOf(ctx));
    if (error.empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(P::kName, " on the GPU failed: ", error));
  }
};
#endif  // GOOGLE_CUDA

// One call of primitive P: its Check on the input shapes and attributes `a`, the codes in
// [0, num_buckets), the outputs allocated (or forwarded), then Launch unless every output is empty.
template <typename Device, typename P, typename T>
Status ComputePrimitive(OpKernelContext* ctx, const AttributeValue* a) {
  constexpr size_t N = P::kInputs.size(), M = P::kOutputs.size();
  std::array<Shape, N> shapes{};
  TF_RETURN_IF_ERROR(InputShapes<P>(ctx, shapes.data()));
  typename P::Dims d{};
  std::array<Shape, M> out_shapes{};
  TF_RETURN_IF_ERROR(Invalid(P::Check(shapes.data(), a, &d, out_shapes.data())));
  std::array<const Tensor*, N> inputs{};
  for (size_t i = 0; i < N; ++i) {
    inputs[i] = &ctx->input(static_cast<int>(i));
    if (P::kInputs[i].kind == Kind::kCodes) {
      TF_RETURN_IF_ERROR(CheckCodes<Device>(ctx, *inputs[i], P::kInputs[i].name, CodeBound(d)));
    }
  }
  std::array<const Tensor*, M> outputs{};
  bool work = false;
  for (size_t i = 0; i < M; ++i) {
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(AllocateOutput(ctx, static_cast<int>(i), P::kOutputs[i], out_shapes[i], &out));
    outputs[i] = out;
    work = work || out->NumElements() > 0;
  }
  if (!work) return absl::OkStatus();
  return Launch<Device, P, T>::Run(ctx, d, a, Refs(inputs), Refs(outputs));
}

template <typename Device, typename P, typename T>
class PrimitiveOp : public OpKernel {
 public:
  explicit PrimitiveOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadAttributes<P>(ctx, attributes_.data()));
  }
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, (ComputePrimitive<Device, P, T>(ctx, attributes_.data())));
  }

 private:
  std::array<AttributeValue, P::kAttributes.size()> attributes_{};
};

// YosoHadamardHashCodes runs one of two primitives, as its `interleaved` attribute says.
template <typename Device, typename T>
class HadamardHashCodesOp : public OpKernel {
 public:
  explicit HadamardHashCodesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("interleaved", &interleaved_));
    OP_REQUIRES_OK(ctx, ReadAttributes<HadamardHashCodes>(ctx, attributes_.data()));
  }
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, interleaved_ ? ComputePrimitive<Device, HadamardInterleavedHashCodes, T>(ctx, attributes_.data())
                                     : ComputePrimitive<Device, HadamardHashCodes, T>(ctx, attributes_.data()));
  }

 private:
  bool interleaved_ = false;
  std::array<AttributeValue, HadamardHashCodes::kAttributes.size()> attributes_{};
};

}  // namespace

// The raw op of each primitive (keras_yoso/ops/_spec.py's raw_op) on a device and float type. The GPU
// registrations are those of KY_GPU_PRIMITIVES (tests/test_spec.py holds them to _spec's devices).
#define KY_REGISTER_PRIMITIVE(OP, DEVICE_NAME, DeviceType, P, T) \
  REGISTER_KERNEL_BUILDER(Name(OP).Device(DEVICE_NAME).TypeConstraint<T>("T"), PrimitiveOp<DeviceType, P, T>);

#define KY_REGISTER(DEVICE_NAME, DeviceType, T)                                                       \
  KY_REGISTER_PRIMITIVE("YosoGaussianHashCodes", DEVICE_NAME, DeviceType, GaussianHashCodes, T)       \
  REGISTER_KERNEL_BUILDER(Name("YosoHadamardHashCodes").Device(DEVICE_NAME).TypeConstraint<T>("T"),   \
                          HadamardHashCodesOp<DeviceType, T>);                                        \
  KY_REGISTER_PRIMITIVE("YosoLshCumulation", DEVICE_NAME, DeviceType, LshCumulation, T)               \
  KY_REGISTER_PRIMITIVE("YosoLshCumulationStep", DEVICE_NAME, DeviceType, LshCumulationStep, T)       \
  KY_REGISTER_PRIMITIVE("YosoWeightedLshCumulation", DEVICE_NAME, DeviceType, WeightedLshCumulation, T) \
  KY_REGISTER_PRIMITIVE("YosoLowerBoundGradients", DEVICE_NAME, DeviceType, LowerBoundGradients, T) \
  KY_REGISTER_PRIMITIVE("YosoCollisionCumulation", DEVICE_NAME, DeviceType, CollisionCumulation, T)

KY_REGISTER(DEVICE_CPU, CPUDevice, float)
KY_REGISTER(DEVICE_CPU, CPUDevice, Eigen::half)
KY_REGISTER(DEVICE_CPU, CPUDevice, Eigen::bfloat16)
#if GOOGLE_CUDA
KY_REGISTER(DEVICE_GPU, GPUDevice, float)
KY_REGISTER(DEVICE_GPU, GPUDevice, Eigen::half)
KY_REGISTER(DEVICE_GPU, GPUDevice, Eigen::bfloat16)
#endif

}  // namespace keras_yoso
