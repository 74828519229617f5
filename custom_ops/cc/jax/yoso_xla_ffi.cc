// XLA FFI handlers of the keras-yoso kernels, for JAX (keras_yoso/ops/providers/jax.py).
//
// Glue only, generic over the primitives: per primitive of KY_PRIMITIVES
// (custom_ops/cc/kernels/yoso_primitives.h) a CPU handler ky_xla_<name> and a CUDA handler
// ky_xla_cuda_<name>, each of which reads its buffers in the primitive's order and its attributes
// by name, turns them into KyTensor views and calls the C ABI of custom_ops/cc/c_api/yoso_c_api.h,
// which checks everything and runs the kernel: ky_run on the library's own thread pool, or
// ky_run_device on XLA's CUDA stream with a workspace from XLA's scratch allocator. A failed call
// becomes an ffi::Error with the C ABI's message. Both are registered under the same target name
// (keras_yoso_<name>), for platform "cpu" and "CUDA"; XLA picks by the platform it lowers for. The
// CUDA handlers compile without CUDA headers (the stream is an opaque pointer here), and the
// Python side registers them only for primitives the library has CUDA kernels for.
//
// Batching: every argument has a core rank, the rank the primitive declares for it (codes 3,
// masks 2, per-position tensors 3, hash parameters 2 or 3, decoding tables 4). The Python side calls these with
// vmap_method="broadcast_all", so under jax.vmap every argument and output carry the same extra
// leading dims; the handler then calls the entry once per leading index, on offset pointers.
//
// Built against the header-only XLA FFI API of the jaxlib in the build environment (setup.py pins
// an old jaxlib, FFI API 0.1, so one library serves every newer jax); compiled into the same
// library as the C ABI, with -fvisibility=hidden: only the ky_xla_* handlers below are exported.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "xla/ffi/api/ffi.h"
#include "yoso_c_api.h"
#include "yoso_primitives.h"

namespace ffi = xla::ffi;

#define KY_XLA_DECLARE(name, P)                                                  \
  KY_EXPORT XLA_FFI_Error* ky_xla_##name(XLA_FFI_CallFrame* call_frame);        \
  KY_EXPORT XLA_FFI_Error* ky_xla_cuda_##name(XLA_FFI_CallFrame* call_frame);
extern "C" {
KY_PRIMITIVES(KY_XLA_DECLARE)
}
#undef KY_XLA_DECLARE

namespace keras_yoso {
namespace {

constexpr int64_t kErrorSize = KY_ERROR_SIZE;
// The alignment asked of XLA's scratch allocator: XLA refuses more than 16 bytes (its device
// allocations are 256-byte aligned whatever is asked), and the CUDA launchers need no more.
constexpr size_t kScratchAlignment = 16;

// One argument of a handler: its buffer, the rank its primitive declares for it, its name in messages.
struct Operand {
  std::optional<ffi::AnyBuffer> buffer;  // always set (AnyBuffer has no default constructor)
  int core_rank;
  const char* name;
};

// The KY dtype code of an XLA element type, or -1.
int32_t KyDtype(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32: return KY_FLOAT32;
    case ffi::DataType::F16: return KY_FLOAT16;
    case ffi::DataType::BF16: return KY_BFLOAT16;
    case ffi::DataType::S32: return KY_INT32;
    default: return -1;
  }
}

int64_t ByteWidth(int32_t ky_dtype) { return ky_dtype == KY_FLOAT32 || ky_dtype == KY_INT32 ? 4 : 2; }

std::string ShapeText(ffi::AnyBuffer::Dimensions dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

// A KyTensor over the core dims of `operand` (everything after its `leading` leading dims); its
// data pointer is that of leading index 0. Sets *stride_bytes to the bytes of one core tensor.
std::string CoreView(const Operand& operand, int leading, KyTensor* view, int64_t* stride_bytes) {
  const int32_t dtype = KyDtype(operand.buffer->element_type());
  if (dtype < 0) {
    return std::string(operand.name) + " has an element type the keras_yoso kernels do not take (XLA type " +
           std::to_string(static_cast<int>(operand.buffer->element_type())) +
           "); they take float32, float16, bfloat16 and int32";
  }
  const auto dims = operand.buffer->dimensions();
  const int rank = static_cast<int>(dims.size()) - leading;
  if (rank < 0 || rank > KY_MAX_RANK) {
    return std::string(operand.name) + " has shape " + ShapeText(dims) + ", rank out of range";
  }
  view->data = operand.buffer->untyped_data();
  view->dtype = dtype;
  view->rank = rank;
  int64_t elements = 1;
  for (int i = 0; i < rank; ++i) {
    view->dims[i] = dims[leading + i];
    elements *= dims[leading + i];
  }
  *stride_bytes = elements * ByteWidth(dtype);
  return "";
}

// Calls `entry(inputs, outputs, error)` once per leading index of the extra leading dims of the
// first output (those beyond its core rank), which every input and output must share
// (vmap_method="broadcast_all"). With no leading dims the buffers go to the entry as they are,
// so it reports bad ranks itself.
template <size_t N, size_t M, typename Entry>
ffi::Error RunBatched(const std::array<Operand, N>& inputs, const std::array<Operand, M>& outputs,
                      Entry&& entry) {
  const auto out_dims = outputs[0].buffer->dimensions();
  const int leading = std::max(0, static_cast<int>(out_dims.size()) - outputs[0].core_rank);
  int64_t count = 1;
  for (int i = 0; i < leading; ++i) count *= out_dims[i];
  std::array<const Operand*, N + M> operands{};
  for (size_t i = 0; i < N + M; ++i) operands[i] = i < N ? &inputs[i] : &outputs[i - N];
  for (const Operand* operand : operands) {
    if (leading == 0) break;
    const auto dims = operand->buffer->dimensions();
    const bool same = static_cast<int>(dims.size()) == operand->core_rank + leading &&
                      std::equal(dims.begin(), dims.begin() + leading, out_dims.begin());
    if (!same) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string("keras_yoso XLA FFI: ") + operand->name + " has shape " + ShapeText(dims) +
                            ", expected rank " + std::to_string(operand->core_rank) + " after the " +
                            std::to_string(leading) + " leading batch dims of the output " +
                            ShapeText(out_dims) + " (the same leading dims on every input)");
    }
  }
  std::array<KyTensor, N + M> views{};
  std::array<int64_t, N + M> strides{};
  for (size_t i = 0; i < N + M; ++i) {
    const std::string error = CoreView(*operands[i], leading, &views[i], &strides[i]);
    if (!error.empty()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, error);
  }
  std::array<KyTensor, N> in{};
  std::array<KyTensor, M> out{};
  char message[kErrorSize] = {0};
  for (int64_t index = 0; index < count; ++index) {
    for (size_t i = 0; i < N + M; ++i) {
      KyTensor& at = i < N ? in[i] : out[i - N];
      at = views[i];
      at.data = static_cast<char*>(views[i].data) + index * strides[i];
    }
    const int32_t status = entry(in, out, message);
    if (status == KY_OK) continue;
    return ffi::Error(status == KY_INVALID_ARGUMENT ? ffi::ErrorCode::kInvalidArgument : ffi::ErrorCode::kInternal,
                      std::string(message));
  }
  return ffi::Error::Success();
}

int32_t Threads(int64_t num_threads) {
  return static_cast<int32_t>(std::clamp<int64_t>(num_threads, 0, INT32_MAX));
}

ffi::Error Invalid(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "keras_yoso XLA FFI: " + message);
}

// The attributes of P by name into values (in P's order; one left out takes its default when it
// is not required: `causal` was added after the first releases, so custom calls traced before it
// keep running), and `num_threads`. Any other attribute is an error.
template <typename P>
ffi::Error ReadAttributes(const ffi::Dictionary& attributes, AttributeValue* values, int64_t* num_threads) {
  size_t found = 0;
  for (size_t i = 0; i < P::kAttributes.size(); ++i) {
    const AttributeSpec& spec = P::kAttributes[i];
    if (!attributes.contains(spec.name)) {
      if (spec.required) return Invalid(std::string("missing attribute ") + spec.name);
      values[i].int_value = spec.default_value;
      continue;
    }
    if (spec.kind == AttributeKind::kInt) {
      ffi::ErrorOr<int64_t> value = attributes.get<int64_t>(spec.name);
      if (value.has_error()) return Invalid(std::string("attribute ") + spec.name + " must be an int64 scalar");
      values[i].int_value = value.value();
    } else {
      ffi::ErrorOr<float> value = attributes.get<float>(spec.name);
      if (value.has_error()) return Invalid(std::string("attribute ") + spec.name + " must be a float32 scalar");
      values[i].float_value = value.value();
    }
    ++found;
  }
  if (!attributes.contains("num_threads")) return Invalid("missing attribute num_threads");
  ffi::ErrorOr<int64_t> threads = attributes.get<int64_t>("num_threads");
  if (threads.has_error()) return Invalid("attribute num_threads must be an int64 scalar");
  *num_threads = threads.value();
  if (found + 1 != attributes.size()) {
    std::string names;
    for (const AttributeSpec& spec : P::kAttributes) names += std::string(spec.name) + ", ";
    return Invalid(std::string("unexpected attribute (") + P::kName + " takes " + names + "num_threads)");
  }
  return ffi::Error::Success();
}

// One call of primitive P as the C ABI takes it: its buffers as Operands (for RunBatched) and its
// attributes as KyAttributes.
template <typename P>
struct Call {
  std::array<Operand, P::kInputs.size()> inputs{};
  std::array<Operand, P::kOutputs.size()> outputs{};
  std::array<KyAttribute, P::kAttributes.size()> attributes{};
  int64_t num_threads = 0;
};

// Reads the P::kInputs.size() buffers, P::kOutputs.size() results and the attributes of a call.
template <typename P>
ffi::Error ReadCall(ffi::RemainingArgs& args, ffi::RemainingRets& rets, const ffi::Dictionary& attributes,
                    Call<P>* call) {
  constexpr size_t N = P::kInputs.size(), A = P::kAttributes.size(), M = P::kOutputs.size();
  if (args.size() != N || rets.size() != M) {
    return Invalid(std::string(P::kName) + " takes " + std::to_string(N) + " buffers and " + std::to_string(M) +
                   " results, got " + std::to_string(args.size()) + " and " + std::to_string(rets.size()));
  }
  for (size_t i = 0; i < N; ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    call->inputs[i] = Operand{buffer.value(), P::kInputs[i].rank, P::kInputs[i].name};
  }
  for (size_t i = 0; i < M; ++i) {
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    call->outputs[i] = Operand{*buffer.value(), P::kOutputs[i].rank, P::kOutputs[i].name};
  }
  std::array<AttributeValue, A> values{};
  ffi::Error status = ReadAttributes<P>(attributes, values.data(), &call->num_threads);
  if (status.failure()) return status;
  for (size_t i = 0; i < A; ++i) call->attributes[i] = KyAttribute{values[i].int_value, values[i].float_value};
  return ffi::Error::Success();
}

// The CPU handler of primitive P: batched over the leading dims of vmap (RunBatched), each batch
// index one ky_run.
template <typename P>
ffi::Error Handler(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attributes) {
  constexpr int32_t N = P::kInputs.size(), A = P::kAttributes.size(), M = P::kOutputs.size();
  Call<P> call;
  ffi::Error status = ReadCall<P>(args, rets, attributes, &call);
  if (status.failure()) return status;
  return RunBatched(call.inputs, call.outputs, [&](std::array<KyTensor, N>& in, std::array<KyTensor, M>& out,
                                                   char* error) {
    return ky_run(P::kName, in.data(), N, call.attributes.data(), A, out.data(), M, Threads(call.num_threads), error,
                  kErrorSize);
  });
}

// The CUDA handler of primitive P: as Handler, each batch index one ky_run_device on XLA's stream,
// with one workspace from XLA's scratch allocator (every batch index has the same shapes) that lives
// until the handler returns.
template <typename P>
ffi::Error CudaHandler(void* stream, ffi::ScratchAllocator scratch, ffi::RemainingArgs args, ffi::RemainingRets rets,
                       ffi::Dictionary attributes) {
  constexpr int32_t N = P::kInputs.size(), A = P::kAttributes.size(), M = P::kOutputs.size();
  Call<P> call;
  ffi::Error status = ReadCall<P>(args, rets, attributes, &call);
  if (status.failure()) return status;
  std::optional<void*> workspace;
  int64_t bytes = 0;
  return RunBatched(call.inputs, call.outputs, [&](std::array<KyTensor, N>& in, std::array<KyTensor, M>& out,
                                                   char* error) {
    if (!workspace.has_value()) {
      const int32_t sized = ky_device_workspace_bytes(P::kName, in.data(), N, call.attributes.data(), A, &bytes, error,
                                                      kErrorSize);
      if (sized != KY_OK) return sized;
      workspace = scratch.Allocate(static_cast<size_t>(std::max<int64_t>(bytes, 1)), kScratchAlignment);
      if (!workspace.has_value()) {
        const std::string message = std::string(P::kName) + ": XLA's scratch allocator could not allocate a " +
                                    std::to_string(bytes) + "-byte workspace";
        std::snprintf(error, kErrorSize, "%s", message.c_str());
        return KY_INTERNAL;
      }
    }
    return ky_run_device(P::kName, in.data(), N, call.attributes.data(), A, out.data(), M, *workspace, bytes, stream,
                         error, kErrorSize);
  });
}

}  // namespace
}  // namespace keras_yoso

#define KY_XLA_HANDLER(name, P)                                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(ky_xla_##name, keras_yoso::Handler<keras_yoso::P>,                   \
                                ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(ky_xla_cuda_##name, keras_yoso::CudaHandler<keras_yoso::P>,          \
                                ffi::Ffi::Bind()                                                      \
                                    .Ctx<ffi::PlatformStream<void*>>()                                \
                                    .Ctx<ffi::ScratchAllocator>()                                     \
                                    .RemainingArgs()                                                  \
                                    .RemainingRets()                                                  \
                                    .Attrs());
KY_PRIMITIVES(KY_XLA_HANDLER)
#undef KY_XLA_HANDLER
