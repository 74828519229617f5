// TensorFlow OpKernels of keras-yoso: validate inputs with the checks of yoso_checks.h,
// allocate outputs and scratch, then run the algorithm of yoso_cpu.h on TF's CPU worker pool
// or the launcher of yoso_gpu.h on the op's CUDA stream. No math lives here.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include <cstddef>
#include <functional>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "yoso_checks.h"
#include "yoso_cpu.h"
#if GOOGLE_CUDA
#include "tensorflow/core/util/determinism.h"
#include "yoso_gpu.h"
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

// A non-empty error text of yoso_checks.h as InvalidArgumentError.
Status Invalid(const std::string& error) {
  return error.empty() ? absl::OkStatus() : absl::InvalidArgumentError(error);
}

// The shapes of the op's first N inputs for yoso_checks.h; names[i] is input i's name in
// REGISTER_OP.
template <size_t N>
Status InputShapes(OpKernelContext* ctx, const char* const (&names)[N], Shape (&shapes)[N]) {
  for (size_t i = 0; i < N; ++i) {
    const Tensor& t = ctx->input(static_cast<int>(i));
    if (t.dims() > kMaxCheckedRank) {
      return absl::InvalidArgumentError(RankTooHighMessage(names[i], t.dims()));
    }
    shapes[i].rank = t.dims();
    for (int axis = 0; axis < t.dims(); ++axis) shapes[i].dims[axis] = t.dim_size(axis);
  }
  return absl::OkStatus();
}

std::string ShapeString(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (auto it = dims.begin(); it != dims.end(); ++it) {
    if (it != dims.begin()) s += ", ";
    s += std::to_string(*it);
  }
  return s + "]";
}

// Allocates output 0 with shape `dims` (described as `meaning`), or fails with
// InvalidArgumentError when its element count overflows int64: a huge dimension of an empty
// input can reach the output (e.g. value [1, 0, 2^62] with 4 queries).
Status AllocateOutput(OpKernelContext* ctx, const char* meaning,
                      std::initializer_list<int64_t> dims, Tensor** out) {
  TensorShape shape;
  if (!TensorShape::BuildTensorShape(dims, &shape).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the output ", meaning, " = ",
                                                   ShapeString(dims),
                                                   " would have more than 2**63 - 1 elements"));
  }
  return ctx->allocate_output(0, shape, out);
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

// The CUDA kernels sum over every key: the causal cumulations (causal != 0) run on the CPU
// kernels or, through keras_yoso.ops, on the composite (keras_yoso/ops/providers/tensorflow.py routes
// causal calls on GPU tensors there).
Status CheckGpuCausal(const char* op_name, int64_t causal) {
  if (causal == 0) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      op_name, " has no GPU kernel for causal = ", causal,
      " (the CUDA kernels take causal = 0 only). Run it on CPU, or call keras_yoso.ops, which "
      "runs causal cumulations of GPU tensors on the composite."));
}

Status AllocateWorkspace(OpKernelContext* ctx, size_t bytes, Tensor* workspace) {
  return ctx->allocate_temp(tensorflow::DT_INT8,
                            TensorShape({static_cast<int64_t>(std::max<size_t>(bytes, 1))}),
                            workspace);
}
#endif  // GOOGLE_CUDA

template <typename T>
const T* Ptr(const Tensor& t) { return t.flat<T>().data(); }
template <typename T>
T* MutablePtr(Tensor* t) { return t->flat<T>().data(); }

// ----------------------------------------------------------------------------
// Hash codes.

template <typename Device, typename T>
struct HashCodesFunctor;

template <typename T>
struct HashCodesFunctor<CPUDevice, T> {
  static Status Gaussian(OpKernelContext* ctx, const HashDims& d, const Tensor& x,
                         const Tensor& projection, Tensor* codes) {
    GaussianHashCodesCpu<T>(d, Ptr<T>(x), Ptr<float>(projection), MutablePtr<int32_t>(codes),
                            TfParallelFor{ctx});
    return absl::OkStatus();
  }
  static Status Hadamard(OpKernelContext* ctx, const HashDims& d, const Tensor& x,
                         const Tensor& signs, Tensor* codes) {
    HadamardHashCodesCpu<T>(d, Ptr<T>(x), Ptr<float>(signs), MutablePtr<int32_t>(codes),
                            TfParallelFor{ctx});
    return absl::OkStatus();
  }
};

#if GOOGLE_CUDA
template <typename T>
struct HashCodesFunctor<GPUDevice, T> {
  static Status Gaussian(OpKernelContext* ctx, const HashDims& d, const Tensor& x,
                         const Tensor& projection, Tensor* codes) {
    return CudaStatus(GaussianHashCodesGpu(d, ScalarTypeOf<T>(), x.data(), Ptr<float>(projection),
                                           MutablePtr<int32_t>(codes), StreamOf(ctx)),
                      "GaussianHashCodesGpu");
  }
  static Status Hadamard(OpKernelContext* ctx, const HashDims& d, const Tensor& x,
                         const Tensor& signs, Tensor* codes) {
    TF_RETURN_IF_ERROR(Invalid(CheckGpuHadamardPaddedDim(d.padded_dim)));
    return CudaStatus(HadamardHashCodesGpu(d, ScalarTypeOf<T>(), x.data(), Ptr<float>(signs),
                                           MutablePtr<int32_t>(codes), StreamOf(ctx)),
                      "HadamardHashCodesGpu");
  }
};
#endif

enum class HashMethod { kGaussian, kHadamard };

template <typename Device, typename T, HashMethod kMethod>
class HashCodesOp : public OpKernel {
 public:
  explicit HashCodesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_hashes", &num_hashes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hash_code_len", &hash_code_len_));
    if constexpr (kMethod == HashMethod::kHadamard) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("interleaved", &interleaved_));
    }
    OP_REQUIRES_OK(ctx, Invalid(CheckHashAttrs(num_hashes_, hash_code_len_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& params = ctx->input(1);
    constexpr bool kGaussian = kMethod == HashMethod::kGaussian;
    Shape s[2];
    OP_REQUIRES_OK(ctx, InputShapes(ctx, {"x", kGaussian ? "projection" : "signs"}, s));
    HashDims d{};
    OP_REQUIRES_OK(ctx, Invalid(kGaussian
                                    ? CheckGaussianHash(s[0], s[1], num_hashes_, hash_code_len_, &d)
                                    : CheckHadamardHash(s[0], s[1], num_hashes_, hash_code_len_,
                                                        interleaved_, &d)));
    Tensor* codes = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, "codes [batch, num_hashes, length]",
                                       {d.batch, num_hashes_, d.length}, &codes));
    if (codes->NumElements() == 0) return;
    using F = HashCodesFunctor<Device, T>;
    OP_REQUIRES_OK(ctx, kGaussian ? F::Gaussian(ctx, d, x, params, codes)
                                  : F::Hadamard(ctx, d, x, params, codes));
  }

 private:
  int64_t num_hashes_ = 0;
  int64_t hash_code_len_ = 0;
  bool interleaved_ = false;
};

// ----------------------------------------------------------------------------
// Cumulations.

template <typename Device, typename T>
struct CumulationFunctor;

template <typename T>
struct CumulationFunctor<CPUDevice, T> {
  static Status Plain(OpKernelContext* ctx, const CumulationDims& d, int64_t causal,
                      const Tensor& qm, const Tensor& qc, const Tensor& km, const Tensor& kc,
                      const Tensor& value, Tensor* out) {
    LshCumulationCpu<T>(d, causal, Ptr<float>(qm), Ptr<int32_t>(qc), Ptr<float>(km),
                        Ptr<int32_t>(kc), Ptr<T>(value), MutablePtr<T>(out), TfParallelFor{ctx});
    return absl::OkStatus();
  }
  static Status Weighted(OpKernelContext* ctx, const CumulationDims& d, int64_t causal,
                         const Tensor& qm, const Tensor& qc, const Tensor& qw, const Tensor& km,
                         const Tensor& kc, const Tensor& kw, const Tensor& value, Tensor* out) {
    WeightedLshCumulationCpu<T>(d, causal, Ptr<float>(qm), Ptr<int32_t>(qc), Ptr<T>(qw),
                                Ptr<float>(km), Ptr<int32_t>(kc), Ptr<T>(kw), Ptr<T>(value),
                                MutablePtr<T>(out), TfParallelFor{ctx});
    return absl::OkStatus();
  }
  static Status Collision(OpKernelContext* ctx, const CumulationDims& d, int tau, float eps,
                          const Tensor& qm, const Tensor& qc, const Tensor& q, const Tensor& qw,
                          const Tensor& km, const Tensor& kc, const Tensor& k, const Tensor& kw,
                          Tensor* out) {
    Tensor sorted_codes, sorted_index;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT32, kc.shape(), &sorted_codes));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT32, kc.shape(), &sorted_index));
    SortKeysByCodeCpu(d, Ptr<int32_t>(kc), MutablePtr<int32_t>(&sorted_codes),
                      MutablePtr<int32_t>(&sorted_index), TfParallelFor{ctx});
    CollisionCumulationCpu<T>(d, tau, eps, Ptr<float>(qm), Ptr<int32_t>(qc), Ptr<T>(q), Ptr<T>(qw),
                              Ptr<float>(km), Ptr<int32_t>(kc), Ptr<T>(k), Ptr<T>(kw),
                              Ptr<int32_t>(sorted_codes), Ptr<int32_t>(sorted_index),
                              MutablePtr<T>(out), TfParallelFor{ctx});
    return absl::OkStatus();
  }
};

#if GOOGLE_CUDA
template <typename T>
struct CumulationFunctor<GPUDevice, T> {
  static Status Plain(OpKernelContext* ctx, const CumulationDims& d, int64_t causal,
                      const Tensor& qm, const Tensor& qc, const Tensor& km, const Tensor& kc,
                      const Tensor& value, Tensor* out) {
    TF_RETURN_IF_ERROR(CheckGpuCausal("YosoLshCumulation", causal));
    TF_RETURN_IF_ERROR(CheckNondeterminismAllowed("YosoLshCumulation"));
    Tensor ws;
    const size_t bytes = LshCumulationWorkspaceBytes(d);
    TF_RETURN_IF_ERROR(AllocateWorkspace(ctx, bytes, &ws));
    return CudaStatus(
        LshCumulationGpu(d, ScalarTypeOf<T>(), Ptr<float>(qm), Ptr<int32_t>(qc), Ptr<float>(km),
                         Ptr<int32_t>(kc), value.data(), out->data(), ws.data(), bytes,
                         StreamOf(ctx)),
        "LshCumulationGpu");
  }
  static Status Weighted(OpKernelContext* ctx, const CumulationDims& d, int64_t causal,
                         const Tensor& qm, const Tensor& qc, const Tensor& qw, const Tensor& km,
                         const Tensor& kc, const Tensor& kw, const Tensor& value, Tensor* out) {
    TF_RETURN_IF_ERROR(CheckGpuCausal("YosoWeightedLshCumulation", causal));
    TF_RETURN_IF_ERROR(CheckNondeterminismAllowed("YosoWeightedLshCumulation"));
    Tensor ws;
    const size_t bytes = WeightedLshCumulationWorkspaceBytes(d);
    TF_RETURN_IF_ERROR(AllocateWorkspace(ctx, bytes, &ws));
    return CudaStatus(WeightedLshCumulationGpu(d, ScalarTypeOf<T>(), Ptr<float>(qm),
                                               Ptr<int32_t>(qc), qw.data(), Ptr<float>(km),
                                               Ptr<int32_t>(kc), kw.data(), value.data(),
                                               out->data(), ws.data(), bytes, StreamOf(ctx)),
                      "WeightedLshCumulationGpu");
  }
  static Status Collision(OpKernelContext* ctx, const CumulationDims& d, int tau, float eps,
                          const Tensor& qm, const Tensor& qc, const Tensor& q, const Tensor& qw,
                          const Tensor& km, const Tensor& kc, const Tensor& k, const Tensor& kw,
                          Tensor* out) {
    Tensor ws;
    const size_t bytes = CollisionCumulationWorkspaceBytes(d);
    TF_RETURN_IF_ERROR(AllocateWorkspace(ctx, bytes, &ws));
    return CudaStatus(CollisionCumulationGpu(d, ScalarTypeOf<T>(), tau, eps, Ptr<float>(qm),
                                             Ptr<int32_t>(qc), q.data(), qw.data(), Ptr<float>(km),
                                             Ptr<int32_t>(kc), k.data(), kw.data(), out->data(),
                                             ws.data(), bytes, StreamOf(ctx)),
                      "CollisionCumulationGpu");
  }
};
#endif

// Shared tail of every cumulation: rejects out-of-range codes, allocates the
// [B, Nq, out_width] output and says whether there is anything to compute.
template <typename Device>
Status CheckCodesAndAllocate(OpKernelContext* ctx, const Tensor& qc, const Tensor& kc,
                             const CumulationDims& d, int64_t out_width, Tensor** out,
                             bool* has_work) {
  TF_RETURN_IF_ERROR(CheckCodes<Device>(ctx, qc, "query_codes", d.num_buckets));
  TF_RETURN_IF_ERROR(CheckCodes<Device>(ctx, kc, "key_codes", d.num_buckets));
  TF_RETURN_IF_ERROR(AllocateOutput(ctx, "[batch, num_queries, width]",
                                    {d.batch, d.num_queries, out_width}, out));
  *has_work = (*out)->NumElements() > 0;
  return absl::OkStatus();
}

// Base of the two table cumulations: parses and checks the num_buckets and causal attrs.
class BucketedOpKernel : public OpKernel {
 public:
  explicit BucketedOpKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_buckets", &num_buckets_));
    OP_REQUIRES_OK(ctx, Invalid(CheckNumBuckets(num_buckets_)));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("causal", &causal_));
    OP_REQUIRES_OK(ctx, Invalid(CheckCausalAttr(causal_)));
  }

 protected:
  int64_t num_buckets_ = 0;
  int64_t causal_ = 0;
};

template <typename Device, typename T>
class LshCumulationOp : public BucketedOpKernel {
 public:
  using BucketedOpKernel::BucketedOpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor &qm = ctx->input(0), &qc = ctx->input(1), &km = ctx->input(2),
                 &kc = ctx->input(3), &value = ctx->input(4);
    Shape s[5];
    OP_REQUIRES_OK(ctx, InputShapes(ctx, {"query_mask", "query_codes", "key_mask", "key_codes",
                                          "value"}, s));
    CumulationDims d{};
    OP_REQUIRES_OK(ctx, Invalid(CheckLshCumulation(s[0], s[1], s[2], s[3], s[4], num_buckets_, &d,
                                                   causal_)));
    Tensor* out = nullptr;
    bool has_work = false;
    OP_REQUIRES_OK(ctx, CheckCodesAndAllocate<Device>(ctx, qc, kc, d, d.value_dim, &out, &has_work));
    if (!has_work) return;
    OP_REQUIRES_OK(ctx, CumulationFunctor<Device, T>::Plain(ctx, d, causal_, qm, qc, km, kc, value,
                                                            out));
  }
};

// The decoding step (CPU only): output [B, T, D] and tables_out, which takes over the tables
// input's buffer when nothing else holds it (then the tables are updated in place).
template <typename T>
class LshCumulationStepOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor &qm = ctx->input(0), &qc = ctx->input(1), &km = ctx->input(2),
                 &kc = ctx->input(3), &value = ctx->input(4), &tables = ctx->input(5);
    Shape s[6];
    OP_REQUIRES_OK(ctx, InputShapes(ctx, {"query_mask", "query_codes", "key_mask", "key_codes",
                                          "value", "tables"}, s));
    CumulationDims d{};
    OP_REQUIRES_OK(ctx, Invalid(CheckLshCumulationStep(s[0], s[1], s[2], s[3], s[4], s[5], &d)));
    Tensor* out = nullptr;
    bool has_work = false;
    OP_REQUIRES_OK(ctx, CheckCodesAndAllocate<CPUDevice>(ctx, qc, kc, d, d.value_dim, &out, &has_work));
    Tensor* tables_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({5}, 1, tables.shape(), &tables_out));
    if (tables_out->NumElements() == 0) return;
    LshCumulationStepCpu<T>(d, Ptr<float>(qm), Ptr<int32_t>(qc), Ptr<float>(km), Ptr<int32_t>(kc),
                            Ptr<T>(value), Ptr<float>(tables), MutablePtr<T>(out),
                            MutablePtr<float>(tables_out), TfParallelFor{ctx});
  }
};

template <typename Device, typename T>
class WeightedLshCumulationOp : public BucketedOpKernel {
 public:
  using BucketedOpKernel::BucketedOpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor &qm = ctx->input(0), &qc = ctx->input(1), &qw = ctx->input(2),
                 &km = ctx->input(3), &kc = ctx->input(4), &kw = ctx->input(5),
                 &value = ctx->input(6);
    Shape s[7];
    OP_REQUIRES_OK(ctx, InputShapes(ctx, {"query_mask", "query_codes", "query_weight", "key_mask",
                                          "key_codes", "key_weight", "value"}, s));
    CumulationDims d{};
    OP_REQUIRES_OK(ctx, Invalid(CheckWeightedLshCumulation(s[0], s[1], s[2], s[3], s[4], s[5], s[6],
                                                           num_buckets_, &d, causal_)));
    Tensor* out = nullptr;
    bool has_work = false;
    OP_REQUIRES_OK(ctx, CheckCodesAndAllocate<Device>(ctx, qc, kc, d, d.value_dim, &out, &has_work));
    if (!has_work) return;
    OP_REQUIRES_OK(ctx, CumulationFunctor<Device, T>::Weighted(ctx, d, causal_, qm, qc, qw, km, kc,
                                                               kw, value, out));
  }
};

template <typename Device, typename T>
class CollisionCumulationOp : public OpKernel {
 public:
  explicit CollisionCumulationOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hash_code_len", &hash_code_len_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, Invalid(CheckCollisionAttrs(hash_code_len_, epsilon_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor &qm = ctx->input(0), &qc = ctx->input(1), &q = ctx->input(2),
                 &qw = ctx->input(3), &km = ctx->input(4), &kc = ctx->input(5),
                 &k = ctx->input(6), &kw = ctx->input(7);
    Shape s[8];
    OP_REQUIRES_OK(ctx, InputShapes(ctx, {"query_mask", "query_codes", "query", "query_weight",
                                          "key_mask", "key_codes", "key", "key_weight"}, s));
    CumulationDims d{};
    OP_REQUIRES_OK(ctx, Invalid(CheckCollisionCumulation(s[0], s[1], s[2], s[3], s[4], s[5], s[6],
                                                         s[7], hash_code_len_, epsilon_, &d)));
    Tensor* out = nullptr;
    bool has_work = false;
    OP_REQUIRES_OK(ctx, CheckCodesAndAllocate<Device>(ctx, qc, kc, d, d.vector_dim, &out, &has_work));
    if (!has_work) return;
    OP_REQUIRES_OK(ctx, CumulationFunctor<Device, T>::Collision(
                            ctx, d, static_cast<int>(hash_code_len_), epsilon_, qm, qc, q, qw,
                            km, kc, k, kw, out));
  }

 private:
  int64_t hash_code_len_ = 0;
  float epsilon_ = 0.0f;
};

}  // namespace

#define KERAS_YOSO_REGISTER(DEVICE_NAME, DeviceType, T)                                          \
  REGISTER_KERNEL_BUILDER(Name("YosoGaussianHashCodes")                                      \
                              .Device(DEVICE_NAME)                                           \
                              .TypeConstraint<T>("T"),                                       \
                          HashCodesOp<DeviceType, T, HashMethod::kGaussian>);                    \
  REGISTER_KERNEL_BUILDER(Name("YosoHadamardHashCodes")                                      \
                              .Device(DEVICE_NAME)                                           \
                              .TypeConstraint<T>("T"),                                       \
                          HashCodesOp<DeviceType, T, HashMethod::kHadamard>);                    \
  REGISTER_KERNEL_BUILDER(Name("YosoLshCumulation").Device(DEVICE_NAME).TypeConstraint<T>("T"), \
                          LshCumulationOp<DeviceType, T>);                                       \
  REGISTER_KERNEL_BUILDER(                                                                   \
      Name("YosoWeightedLshCumulation").Device(DEVICE_NAME).TypeConstraint<T>("T"),          \
      WeightedLshCumulationOp<DeviceType, T>);                                                   \
  REGISTER_KERNEL_BUILDER(                                                                   \
      Name("YosoCollisionCumulation").Device(DEVICE_NAME).TypeConstraint<T>("T"),            \
      CollisionCumulationOp<DeviceType, T>);

KERAS_YOSO_REGISTER(DEVICE_CPU, CPUDevice, float)
KERAS_YOSO_REGISTER(DEVICE_CPU, CPUDevice, Eigen::half)
KERAS_YOSO_REGISTER(DEVICE_CPU, CPUDevice, Eigen::bfloat16)
#define KERAS_YOSO_REGISTER_STEP(T)                                                         \
  REGISTER_KERNEL_BUILDER(Name("YosoLshCumulationStep").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
                          LshCumulationStepOp<T>);
KERAS_YOSO_REGISTER_STEP(float)
KERAS_YOSO_REGISTER_STEP(Eigen::half)
KERAS_YOSO_REGISTER_STEP(Eigen::bfloat16)
#if GOOGLE_CUDA
KERAS_YOSO_REGISTER(DEVICE_GPU, GPUDevice, float)
KERAS_YOSO_REGISTER(DEVICE_GPU, GPUDevice, Eigen::half)
KERAS_YOSO_REGISTER(DEVICE_GPU, GPUDevice, Eigen::bfloat16)
#endif

}  // namespace keras_yoso
