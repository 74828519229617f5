"""The native primitives, declared once: inputs in the C ABI's order, attributes, output shape.

One row per primitive of the native library, as custom_ops/cc/kernels/yoso_primitives.h declares it
for the C ABI (`ky_run` of custom_ops/cc/c_api/yoso_c_api.h runs it by name), the XLA FFI handlers
and the TensorFlow op kernels. Everything on the Python side that restates a primitive is derived
from this table: the attribute values of the ctypes calls (providers/native_library.py), the
`torch.library` schemas and fakes (providers/torch.py), the
XLA FFI targets, attribute types and result shapes (providers/jax.py), the raw-op calls of the
TensorFlow op library (providers/tensorflow.py), the axis roles of the tensors on a device mesh
(`_dispatch.on_mesh`) and the op lists of CI (.ci/run, .ci/bazel_compare.py).
`tests/test_spec.py` reads yoso_primitives.h and the REGISTER_OPs of the TensorFlow op library and
holds them to this table.

`devices` says where each primitive has a kernel: "cpu" (the C++ kernels: `ky_run`) and "gpu" (the
CUDA and Triton kernels: `ky_run_device`, custom_ops/cc/kernels/yoso_gpu_primitives.h's
KY_GPU_PRIMITIVES); a provider runs a primitive on a device where the row lists it, the provider's
kernels are loaded for that device and the build holds that kernel (`providers/base.Provider.runs`;
lower_bound_gradients and lsh_cumulation_step have only the Triton kernels on a GPU, which a build may
leave out). `causal_devices` says where a primitive with a `causal` attribute takes a direction other than
BIDIRECTIONAL: the CPU kernels take every direction; on a GPU only the Triton kernels do (the causal scan
of lsh_cumulation, the causal eq. 4 kernel of lower_bound_gradients; checked against float64 on an H200,
2026-11-29), so a build without their cubins runs causal calls on the composite there.

Every provider primitive (`providers/base.py`) takes its tensors and attributes in this order:
masks float32 `[B, N]` (1 keeps a position), codes int32 `[B, m, N]`, float tensors `[B, N, F]`.
Nothing here imports Keras or a framework, so CI scripts load this file alone.
"""

import collections
import re

# Axis roles of a tensor on a device mesh (`_dispatch.on_mesh`): "batch", "seq" or None per axis.
MASK_ROLES = ("batch", "seq")
CODES_ROLES = ("batch", None, "seq")
ROWS_ROLES = ("batch", "seq", None)

TABLES_ROLES = ("batch", None, None, None)

# kind -> (rank, roles, dtype): "mask" float32 [B, N]; "codes" int32 [B, m, N]; "rows" float
# [B, N, F] (float32, float16 or bfloat16; the primitive's dtype); "tables" float32 bucket tables
# [B, m, num_buckets, D] (the decoding state); "float32" a float32 parameter of its own rank (hash
# parameters, replicated over a mesh).
_KINDS = {"mask": (2, MASK_ROLES, "float32"), "codes": (3, CODES_ROLES, "int32"), "rows": (3, ROWS_ROLES, None),
          "tables": (4, TABLES_ROLES, "float32")}

Input = collections.namedtuple("Input", "name kind rank roles dtype")
# kind: "int" (int64) or "float" (float32); default: its value when a caller leaves it out (None: required).
Attribute = collections.namedtuple("Attribute", "name kind default", defaults=(None,))


def _input(name, kind, rank=None):
    if kind in _KINDS:
        rank, roles, dtype = _KINDS[kind]
    else:
        roles, dtype = (None,) * rank, "float32"
    return Input(name, kind, rank, roles, dtype)


# dtype: the name of the input whose dtype the output takes, or "int32" / "float32".
Output = collections.namedtuple("Output", "name dtype")


# The devices a primitive can have a kernel on.
DEVICES = ("cpu", "gpu")

# The `causal` attribute of the cumulations is a direction, not a flag: which keys count for query i,
# positions aligned (Nq == Nk). CheckCausalAttr of custom_ops/cc/kernels/yoso_checks.h takes these three.
ANTICAUSAL = -1    # keys j >= i
BIDIRECTIONAL = 0  # every key
CAUSAL = 1         # keys j <= i (causal attention)
DIRECTIONS = (ANTICAUSAL, BIDIRECTIONAL, CAUSAL)


def transposed_direction(direction):
    """The direction of a cumulation with the roles of queries and keys exchanged (each key sums the
    queries it meets: the gradients): key j of a causal cumulation meets the queries i >= j, so
    CAUSAL and ANTICAUSAL swap and BIDIRECTIONAL stays."""
    return -direction


class Primitive(collections.namedtuple("Primitive", "name inputs attributes outputs output_shapes raw_op composite "
                                                    "raw_op_attributes in_place devices causal_devices",
                                        defaults=({}, {}, DEVICES, ("cpu",)))):
    """One native primitive `name` (`ky_run(name, ...)` of the C ABI): `inputs` (Input, in the ABI's order),
    `attributes` (Attribute, after the inputs), `outputs` (Output, after the attributes), `output_shapes` (a
    function of (input shapes by name, attributes by name) -> one shape per output), the TensorFlow raw op that
    runs it, `composite`: its keras.ops reference, "family.function" in keras_yoso.ops.composite
    (the composite provider runs it; same arguments), the raw-op attributes that select it there, `in_place`:
    input name -> output name that may share its buffer (the output is that input updated), `devices`: the
    devices of `DEVICES` it has a kernel on ("gpu": a CUDA kernel in the native library and the TensorFlow
    op library, when they were built with nvcc), and `causal_devices`: those whose kernels take `causal` != 0
    (on a GPU: the Triton kernels, which a build may leave out)."""

    def runs_on(self, device, causal=BIDIRECTIONAL):
        """True when the primitive has a kernel on `device` ("cpu", "gpu") for a call in the direction
        `causal` (`DIRECTIONS`)."""
        return device in self.devices and (not causal or device in self.causal_devices)

    @property
    def handler(self):
        """The XLA FFI handler's symbol in the native library."""
        return f"ky_xla_{self.name}"

    @property
    def cuda_handler(self):
        """The XLA FFI CUDA handler's symbol in the native library (registered for platform "CUDA")."""
        return f"ky_xla_cuda_{self.name}"

    @property
    def target(self):
        """The XLA FFI target name on JAX."""
        return f"keras_yoso_{self.name}"

    @property
    def raw_op_function(self):
        """The raw op's Python name in the loaded op library (YosoLshCumulation -> yoso_lsh_cumulation)."""
        return re.sub(r"(?<!^)(?=[A-Z])", "_", self.raw_op).lower()

    @property
    def input_names(self):
        return tuple(t.name for t in self.inputs)

    @property
    def attribute_names(self):
        return tuple(a.name for a in self.attributes)

    def check_ranks(self, shapes):
        """ValueError naming the first input whose rank is not the table's (shapes: name -> tuple), so
        that a provider never indexes a malformed shape."""
        for spec in self.inputs:
            if len(shapes[spec.name]) != spec.rank:
                raise ValueError(f"{spec.name} of {self.name} must have rank {spec.rank}, got shape "
                                 f"{tuple(shapes[spec.name])}")

    def float_dtype_source(self):
        """The input whose dtype the primitive computes in (its float inputs take it), or None
        (hashing: x keeps its own dtype)."""
        source = self.outputs[0].dtype
        return None if source in ("int32", "float32") else source

    def complete(self, arguments):
        """`arguments` (inputs, then attributes) with the defaults of the attributes left out appended."""
        given = len(arguments) - len(self.inputs)
        missing = self.attributes[given:]
        if any(a.default is None for a in missing):
            raise TypeError(f"{self.name} takes {len(self.inputs)} tensors and the attributes "
                            f"{list(self.attribute_names)}; got {len(arguments)} arguments")
        return tuple(arguments) + tuple(a.default for a in missing)


def _hash_shape(shapes, attributes):
    x, num_hashes, bits = shapes["x"], attributes["num_hashes"], attributes["num_hashes"] * attributes["hash_code_len"]
    # The output's axis 1, checked before it is allocated: num_hashes >= 1 and the parameters hold
    # its num_hashes * hash_code_len bits (the kernels check the rest).
    params = shapes["projection"][1] if "projection" in shapes else shapes["signs"][0] * shapes["signs"][2]
    if num_hashes < 1 or bits > params:
        raise ValueError(f"num_hashes must be >= 1 and num_hashes * hash_code_len ({bits}) at most the bits of the "
                         f"hash parameters ({params}), got num_hashes={num_hashes}")
    return ((x[0], num_hashes, x[1]),)


def _cumulation_shape(shapes, attributes):
    return ((shapes["query_codes"][0], shapes["query_codes"][2], shapes["value"][2]),)


def _collision_shape(shapes, attributes):
    return (tuple(shapes["query"]),)


def _lower_bound_shapes(shapes, attributes):
    return tuple(shapes["query"]), tuple(shapes["key"])


def _step_shapes(shapes, attributes):
    return _cumulation_shape(shapes, attributes) + (tuple(shapes["tables"]),)


_CODES_OUT = (Output("codes", "int32"),)
_VALUE_OUT = (Output("output", "value"),)


_HASH_ATTRIBUTES = (Attribute("num_hashes", "int"), Attribute("hash_code_len", "int"))
# causal: the direction of the cumulation, one of DIRECTIONS.
_CUMULATION_ATTRIBUTES = (Attribute("num_buckets", "int"), Attribute("causal", "int", BIDIRECTIONAL))

PRIMITIVES = {p.name: p for p in (
    Primitive(name="gaussian_hash_codes", inputs=(_input("x", "rows"), _input("projection", "float32", 2)),
              attributes=_HASH_ATTRIBUTES, outputs=_CODES_OUT, output_shapes=_hash_shape,
              raw_op="YosoGaussianHashCodes", composite="hashing.gaussian_hash_codes"),
    Primitive(name="hadamard_hash_codes", inputs=(_input("x", "rows"), _input("signs", "float32", 3)),
              attributes=_HASH_ATTRIBUTES, outputs=_CODES_OUT, output_shapes=_hash_shape,
              raw_op="YosoHadamardHashCodes", composite="hashing.hadamard_hash_codes",
              raw_op_attributes={"interleaved": False}),
    Primitive(name="hadamard_interleaved_hash_codes", inputs=(_input("x", "rows"), _input("signs", "float32", 3)),
              attributes=_HASH_ATTRIBUTES, outputs=_CODES_OUT, output_shapes=_hash_shape,
              raw_op="YosoHadamardHashCodes", composite="hashing.hadamard_interleaved_hash_codes",
              raw_op_attributes={"interleaved": True}),
    Primitive(name="lsh_cumulation",
              inputs=(_input("query_mask", "mask"), _input("query_codes", "codes"), _input("key_mask", "mask"),
                      _input("key_codes", "codes"), _input("value", "rows")),
              attributes=_CUMULATION_ATTRIBUTES, outputs=_VALUE_OUT, output_shapes=_cumulation_shape,
              raw_op="YosoLshCumulation", composite="causal.directed_lsh_cumulation", causal_devices=DEVICES),
    Primitive(name="lsh_cumulation_step",
              inputs=(_input("query_mask", "mask"), _input("query_codes", "codes"), _input("key_mask", "mask"),
                      _input("key_codes", "codes"), _input("value", "rows"), _input("tables", "tables")),
              attributes=(), outputs=_VALUE_OUT + (Output("tables_out", "float32"),), output_shapes=_step_shapes,
              raw_op="YosoLshCumulationStep", composite="decoding.lsh_cumulation_step",
              in_place={"tables": "tables_out"}),
    Primitive(name="weighted_lsh_cumulation",
              inputs=(_input("query_mask", "mask"), _input("query_codes", "codes"), _input("query_weight", "rows"),
                      _input("key_mask", "mask"), _input("key_codes", "codes"), _input("key_weight", "rows"),
                      _input("value", "rows")),
              attributes=_CUMULATION_ATTRIBUTES, outputs=_VALUE_OUT, output_shapes=_cumulation_shape,
              raw_op="YosoWeightedLshCumulation", composite="causal.directed_weighted_lsh_cumulation"),
    Primitive(name="lower_bound_gradients",
              inputs=(_input("query_mask", "mask"), _input("query_codes", "codes"), _input("query", "rows"),
                      _input("key_mask", "mask"), _input("key_codes", "codes"), _input("key", "rows"),
                      _input("value", "rows"), _input("output_gradient", "rows")),
              attributes=_CUMULATION_ATTRIBUTES,
              outputs=(Output("query_gradient", "query"), Output("key_gradient", "query")),
              output_shapes=_lower_bound_shapes, raw_op="YosoLowerBoundGradients",
              composite="causal.directed_lower_bound_gradients", causal_devices=DEVICES),
    Primitive(name="collision_cumulation",
              inputs=(_input("query_mask", "mask"), _input("query_codes", "codes"), _input("query", "rows"),
                      _input("query_weight", "rows"), _input("key_mask", "mask"), _input("key_codes", "codes"),
                      _input("key", "rows"), _input("key_weight", "rows")),
              attributes=(Attribute("hash_code_len", "int"), Attribute("epsilon", "float")),
              outputs=(Output("output", "query"),), output_shapes=_collision_shape,
              raw_op="YosoCollisionCumulation", composite="collision.collision_cumulation"),
)}


def hash_primitive(method):
    """The hashing primitive of `method` ("gaussian", "hadamard" or "hadamard_interleaved")."""
    return PRIMITIVES[f"{method}_hash_codes"]


def raw_ops(device=None, only=False):
    """The TensorFlow raw ops of the op library, each once, in table order: every one (device None),
    those with a kernel on `device`, or (only=True) those with no kernel but on `device`."""
    return list(dict.fromkeys(p.raw_op for p in PRIMITIVES.values()
                              if device is None or (p.devices == (device,) if only else device in p.devices)))


def roles(name):
    """The mesh axis roles of the tensor input `name` (the same for every primitive that takes it)."""
    found = {t.roles for p in PRIMITIVES.values() for t in p.inputs if t.name == name}
    if len(found) != 1:
        raise KeyError(f"no single role for a primitive input named {name!r}: {sorted(found)}")
    return found.pop()
