// Registration of the keras-yoso ops. Each op's shape function is PrimitiveShape<P> of its
// primitive (custom_ops/cc/kernels/yoso_primitives.h): P::Check, the check the kernels run, on the
// shapes known while the graph is built (unknown dimensions match anything, yoso_checks.h), so bad
// ranks, mismatched sizes and bad attributes fail at graph construction with the kernel's message,
// and the output shapes are the ones Check computes. No shape rule is written here.
// The math of each op is documented in custom_ops/cc/kernels/yoso_cpu.h.
#include <array>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_status.h"
#include "yoso_primitives.h"

namespace keras_yoso {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// The shapes of P's inputs as the graph knows them: each dimension or kUnknownDim; an input of
// unknown rank as P's rank with every dimension unknown.
template <typename P>
Status KnownInputShapes(InferenceContext* c, Shape* shapes) {
  for (size_t i = 0; i < P::kInputs.size(); ++i) {
    const ShapeHandle input = c->input(static_cast<int>(i));
    const bool rank_known = c->RankKnown(input);
    const int rank = rank_known ? c->Rank(input) : P::kInputs[i].rank;
    if (rank > kMaxCheckedRank) {
      return absl::InvalidArgumentError(RankTooHighMessage(P::kInputs[i].name, rank));
    }
    shapes[i].rank = rank;
    for (int axis = 0; axis < rank; ++axis) {
      const DimensionHandle dim = rank_known ? c->Dim(input, axis) : c->UnknownDim();
      shapes[i].dims[axis] = c->ValueKnown(dim) ? c->Value(dim) : kUnknownDim;
    }
  }
  return absl::OkStatus();
}

// The shape function of primitive P's op: P::Check on the known shapes and the attributes, then
// the output shapes it computed (kUnknownDim as an unknown dimension).
template <typename P>
Status PrimitiveShape(InferenceContext* c) {
  std::array<Shape, P::kInputs.size()> in{};
  TF_RETURN_IF_ERROR(KnownInputShapes<P>(c, in.data()));
  std::array<AttributeValue, P::kAttributes.size()> attributes{};
  TF_RETURN_IF_ERROR(ReadAttributes<P>(c, attributes.data()));
  typename P::Dims dims{};
  std::array<Shape, P::kOutputs.size()> out{};
  TF_RETURN_IF_ERROR(Invalid(P::Check(in.data(), attributes.data(), &dims, out.data())));
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<DimensionHandle> output_dims;
    for (int axis = 0; axis < out[i].rank; ++axis) {
      const int64_t dim = out[i].dims[axis];
      output_dims.push_back(Known(dim) ? c->MakeDim(dim) : c->UnknownDim());
    }
    c->set_output(static_cast<int>(i), c->MakeShape(output_dims));
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("YosoGaussianHashCodes")
    .Input("x: T")
    .Input("projection: float")
    .Output("codes: int32")
    .Attr("num_hashes: int >= 1")
    .Attr("hash_code_len: int >= 1")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn(PrimitiveShape<GaussianHashCodes>)
    .Doc(R"doc(
Hyperplane LSH codes from a dense Gaussian projection (YOSO appendix §1.2).
x: [batch, length, dim]. projection: [dim, num_hashes * hash_code_len].
codes: [batch, num_hashes, length], bit i of hash h is [<x, projection[:, h*tau+i]> > 0].
)doc");

REGISTER_OP("YosoHadamardHashCodes")
    .Input("x: T")
    .Input("signs: float")
    .Output("codes: int32")
    .Attr("num_hashes: int >= 1")
    .Attr("hash_code_len: int >= 1")
    .Attr("interleaved: bool = false")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn(PrimitiveShape<HadamardHashCodes>)
    .Doc(R"doc(
Hyperplane LSH codes from the fast Hadamard approximation (YOSO appendix §1.2).
x: [batch, length, dim]. signs: [num_blocks, 3, padded_dim] of +-1, padded_dim a power
of two >= dim, num_blocks * padded_dim >= num_hashes * hash_code_len.
codes: [batch, num_hashes, length] from the signs of concat_q H D3 H D2 H D1 pad(x): bit i of
hash h is row k = h * hash_code_len + i of the concatenation (interleaved = false, the
"hadamard" method), or row k / num_blocks of block k % num_blocks (interleaved = true, the
"hadamard_interleaved" method: a hash's bits from different blocks).
)doc");

REGISTER_OP("YosoLshCumulation")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("value: T")
    .Output("output: T")
    .Attr("num_buckets: int")
    .Attr("causal: int = 0")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn(PrimitiveShape<LshCumulation>)
    .Doc(R"doc(
LSH cumulation (YOSO eq. 2 averaged over hashes):
output[b,i] = qmask[b,i]/m * sum_h sum_j kmask[b,j] [qc[b,h,i] == kc[b,h,j]] value[b,j].
causal: 0 sums over every key; 1 over keys j <= i; -1 over keys j >= i (causal != 0 needs
num_queries == num_keys: query i and key i are position i). Which devices run which causal values:
docs/gpu.md.
)doc");

REGISTER_OP("YosoLshCumulationStep")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("value: T")
    .Input("tables: float")
    .Output("output: T")
    .Output("tables_out: float")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn(PrimitiveShape<LshCumulationStep>)
    .Doc(R"doc(
Decoding step of causal YOSO: T new positions over the bucket tables of the earlier ones.
Per (b, h), in position order t, key t's value joins bucket kc[b,h,t] (when kept), then query t
reads bucket qc[b,h,t]: output[b,t] = qmask[b,t]/m * sum_h tables_t[b,h,qc[b,h,t]].
tables, tables_out: [batch, num_hashes, num_buckets, value_dim] float32 (tables_out: the tables
with the new keys added). Its GPU kernel is a Triton one (docs/gpu.md).
)doc");

REGISTER_OP("YosoWeightedLshCumulation")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("query_weight: T")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("key_weight: T")
    .Input("value: T")
    .Output("output: T")
    .Attr("num_buckets: int")
    .Attr("causal: int = 0")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn(PrimitiveShape<WeightedLshCumulation>)
    .Doc(R"doc(
Weighted LSH cumulation: YosoLshCumulation with pair (i, j) weighted by
<query_weight[b,i], key_weight[b,j]>; causal as in YosoLshCumulation.
)doc");

REGISTER_OP("YosoLowerBoundGradients")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("query: T")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("key: T")
    .Input("value: T")
    .Input("output_gradient: T")
    .Output("query_gradient: T")
    .Output("key_gradient: T")
    .Attr("num_buckets: int")
    .Attr("causal: int = 0")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn(PrimitiveShape<LowerBoundGradients>)
    .Doc(R"doc(
The eq. 4 lower-bound backward in one pass (unscaled): with s_ij = [qc == kc] <dY_i, V_j> over kept
pairs, query_gradient_i = qmask_i/m sum_h sum_j s_ij K_j and key_gradient_j = kmask_j/m sum_h sum_i
s_ij Q_i; causal as in YosoLshCumulation (dQ over keys j <= i, dK over queries i >= j).
)doc");

REGISTER_OP("YosoCollisionCumulation")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("query: T")
    .Input("query_weight: T")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("key: T")
    .Input("key_weight: T")
    .Output("output: T")
    .Attr("hash_code_len: int >= 1")
    .Attr("epsilon: float")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn(PrimitiveShape<CollisionCumulation>)
    .Doc(R"doc(
Collision estimator of the YOSO-E gradient (*YOSO, appendix eq. 2 on colliding pairs):
output[b,i] = sum over keys j colliding with i in >= 1 hash (once each) of
<query_weight_i, key_weight_j> tau (1-acos(x)/pi)^(tau-1) / (pi sqrt(1-x^2+eps)) key_j,
x = <query_i, key_j> clipped to [-1, 1].
)doc");

}  // namespace keras_yoso
