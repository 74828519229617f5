"""The primitive table (keras_yoso/ops/_spec.py) against the native code it describes: the C++
primitives (custom_ops/cc/kernels/yoso_primitives.h, which the C ABI, the XLA FFI handlers and the
TensorFlow op kernels run) and the TensorFlow REGISTER_OPs. Read as text, so this runs without
building anything; a primitive added or changed on one side only fails here."""

import os
import re

import pytest

from keras_yoso.ops import _spec

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "custom_ops", "cc")
# The C++ Kind of each input kind, and AttributeKind of each attribute kind.
CC_KINDS = {"mask": "kMask", "codes": "kCodes", "rows": "kRows", "float32": "kFloat32", "tables": "kTables"}
CC_ATTRIBUTE_KINDS = {"int": "kInt", "float": "kFloat"}
# The REGISTER_OP type of each input kind ("rows" take the op's dtype attr T).
TF_TYPES = {"mask": "float", "codes": "int32", "rows": "T", "float32": "float", "tables": "float"}


def _read(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def _cc_primitives():
    """name -> {"inputs": [(name, kind, rank)], "attributes": [(name, kind, required)], "outputs":
    [(name, kind)]} of every primitive struct of yoso_primitives.h (shared arrays resolved by name)."""
    source = re.sub(r"//[^\n]*", "", _read("kernels", "yoso_primitives.h"))
    shared = dict(re.findall(r"constexpr std::array<\w+, \d+> (k\w+)\{\{(.*?)\}\};", source, flags=re.S))
    shared.update(re.findall(r"constexpr OutputSpec (k\w+)\{(.*?)\};", source, flags=re.S))

    def field(body, member):
        match = re.search(r"static constexpr (?:std::array<\w+, \d+>|auto) " + member + r"(?:\{\{?(.*?)\}?\};| = (k\w+);)",
                          body, flags=re.S)
        text = match.group(1) if match.group(1) is not None else shared[match.group(2)]
        for name in re.findall(r"\b(k[A-Z]\w+)\b", text):  # a shared entry used inside the list
            if name in shared and name not in ("kMask", "kCodes", "kRows", "kFloat32", "kTables"):
                text = text.replace(name, "{" + shared[name] + "}")
        return text

    primitives = {}
    for struct, body in re.findall(r"\nstruct (\w+) \{(.*?)\n\};", source, flags=re.S):
        names = re.findall(r'kName = (?:kInterleaved \? "(\w+)" : "(\w+)"|"(\w+)")', body)
        if not names:
            continue
        inputs = re.findall(r'\{"(\w+)", Kind::(\w+), (\d+)\}', field(body, "kInputs"))
        attributes = re.findall(r'\{"(\w+)", AttributeKind::(\w+), (true|false), -?\d+\}', field(body, "kAttributes"))
        outputs = re.findall(r'\{"(\w+)", Kind::(\w+), \d+, "[^"]*"', field(body, "kOutputs"))
        interleaved, plain, single = names[0]
        for name in ([interleaved, plain] if interleaved else [single]):
            primitives[name] = {"inputs": [(n, k, int(r)) for n, k, r in inputs],
                                "attributes": [(n, k, req == "true") for n, k, req in attributes],
                                "outputs": outputs}
    return primitives


def _listed_primitives():
    """The names of KY_PRIMITIVES, the list the C ABI and the XLA FFI handlers are generated from."""
    macro = re.search(r"#define KY_PRIMITIVES\(X\)(.*?)\n\n", _read("kernels", "yoso_primitives.h"), flags=re.S)
    return re.findall(r"X\((\w+), \w+\)", macro.group(1))


@pytest.mark.parametrize("name", sorted(_spec.PRIMITIVES))
def test_each_primitive_is_the_cc_primitive_of_the_same_name_inputs_attributes_and_outputs(name):
    primitive = _spec.PRIMITIVES[name]
    declared = _cc_primitives()
    assert name in declared, f"yoso_primitives.h declares no primitive {name}"
    cc = declared[name]
    assert cc["inputs"] == [(t.name, CC_KINDS[t.kind], t.rank) for t in primitive.inputs], cc["inputs"]
    assert cc["attributes"] == [(a.name, CC_ATTRIBUTE_KINDS[a.kind], a.default is None)
                                for a in primitive.attributes], cc["attributes"]
    assert [n for n, _ in cc["outputs"]] == [o.name for o in primitive.outputs], cc["outputs"]


def test_the_cc_primitive_list_is_the_table():
    assert sorted(_listed_primitives()) == sorted(_spec.PRIMITIVES)
    assert set(_cc_primitives()) == set(_spec.PRIMITIVES)


def test_the_primitives_with_a_cuda_kernel_are_those_the_table_lists_on_the_gpu():
    macro = re.search(r"#define KY_GPU_PRIMITIVES\(X\)(.*?)\n\n", _read("kernels", "yoso_gpu_primitives.h"),
                      flags=re.S)
    gpu = re.findall(r"X\((\w+), \w+\)", macro.group(1))
    assert sorted(gpu) == sorted(name for name, p in _spec.PRIMITIVES.items() if "gpu" in p.devices)
    assert all(set(p.devices) <= set(_spec.DEVICES) and "cpu" in p.devices for p in _spec.PRIMITIVES.values())
    # TensorFlow registers a GPU kernel for exactly the raw ops of those primitives.
    body = re.search(r"#define KY_REGISTER\(DEVICE_NAME, DeviceType, T\)(.*?)\n\n", _read("tf", "yoso_kernels.cc"),
                     flags=re.S).group(1)
    assert sorted(set(re.findall(r'"(Yoso\w+)"', body))) == sorted(_spec.raw_ops("gpu"))


def _registered_ops():
    """op name -> ([(input, type)], {attr: "type[ = default]"}, [(output, type)]) of every REGISTER_OP."""
    source = _read("tf", "yoso_ops.cc")
    ops = {}
    for name, body in re.findall(r'REGISTER_OP\("(\w+)"\)(.*?);', source, flags=re.S):
        inputs = re.findall(r'\.Input\("(\w+): (\w+)"\)', body)
        attrs = dict(re.findall(r'\.Attr\("(\w+): ([^"]+)"\)', body))
        ops[name] = (inputs, attrs, re.findall(r'\.Output\("(\w+): (\w+)"\)', body))
    return ops


@pytest.mark.parametrize("name", sorted(_spec.PRIMITIVES))
def test_each_primitive_is_a_registered_tensorflow_op_with_the_same_inputs_and_attrs(name):
    primitive = _spec.PRIMITIVES[name]
    registered = _registered_ops()
    assert primitive.raw_op in registered, f"yoso_ops.cc registers no {primitive.raw_op}"
    inputs, attrs, outputs = registered[primitive.raw_op]
    assert [n for n, _ in outputs] == [o.name for o in primitive.outputs] or len(outputs) == 1, outputs
    assert [ty for _, ty in outputs] == [{"int32": "int32", "float32": "float"}.get(o.dtype, "T")
                                         for o in primitive.outputs], outputs
    assert inputs == [(t.name if t.kind != "float32" else inputs[i][0], TF_TYPES[t.kind])
                      for i, t in enumerate(primitive.inputs)], inputs
    for attribute in primitive.attributes:
        declared = attrs.get(attribute.name, "")
        assert declared.split(" ")[0] == attribute.kind, (attribute, declared)
        default = re.search(r"(?<![<>])= *(\S+)$", declared)
        default = default and default.group(1)
        assert default == (None if attribute.default is None else str(attribute.default)), (attribute, declared)
    for selector in primitive.raw_op_attributes:
        assert attrs.get(selector, "").startswith("bool"), (selector, attrs)
    assert set(attrs) == set(primitive.attribute_names) | set(primitive.raw_op_attributes) | {"T"}, attrs


def test_every_registered_tensorflow_op_runs_a_primitive_of_the_table():
    assert set(_registered_ops()) == set(_spec.raw_ops())


def test_a_tensor_name_has_one_mesh_role_across_the_primitives():
    names = {t.name for p in _spec.PRIMITIVES.values() for t in p.inputs}
    for name in names:
        assert _spec.roles(name)
    assert _spec.roles("query_codes") == _spec.CODES_ROLES and _spec.roles("value") == _spec.ROWS_ROLES


@pytest.mark.parametrize("name", sorted(_spec.PRIMITIVES))
def test_each_primitive_names_a_composite_function_of_its_inputs_and_attributes_in_order(name):
    import importlib
    import inspect

    primitive = _spec.PRIMITIVES[name]
    module, function = primitive.composite.rsplit(".", 1)
    reference = getattr(importlib.import_module(f"keras_yoso.ops.composite.{module}"), function)
    assert list(inspect.signature(reference).parameters) == list(primitive.input_names + primitive.attribute_names)


def test_the_c_abi_constants_python_restates_are_the_headers():
    from keras_yoso.ops.providers import native_library

    header = dict(re.findall(r"#define (KY_\w+) (\d+)", _read("c_api", "yoso_c_api.h")))
    assert int(header["KY_ABI_VERSION"]) == native_library.ABI_VERSION
    assert {name: int(header["KY_" + name.upper()]) for name in native_library.DTYPE_CODES} == \
        native_library.DTYPE_CODES
    assert int(header["KY_MAX_RANK"]) == native_library.MAX_RANK
    assert (int(header["KY_OK"]), int(header["KY_INVALID_ARGUMENT"])) == (native_library._OK,
                                                                          native_library._INVALID_ARGUMENT)
    assert int(header["KY_ERROR_SIZE"]) == native_library._ERROR_SIZE
    assert int(header["KY_PLAN_EXACT_FP32"]) == native_library._PLAN_EXACT_FP32
    assert int(header["KY_PLAN_DETERMINISTIC"]) == native_library._PLAN_DETERMINISTIC
    assert "kErrorSize = KY_ERROR_SIZE" in _read("jax", "yoso_xla_ffi.cc")


def test_the_causal_attribute_is_a_named_direction_that_transposing_reverses():
    # CheckCausalAttr (yoso_checks.h) takes -1, 0 and 1: the table names them, and the gradients'
    # transposed cumulations take the opposite direction through one function, never a hand-written minus.
    low, high = re.search(r"CheckCausalAttr\(int64_t causal\) \{\s*if \(causal >= (-?\d+) && causal <= (-?\d+)\)",
                          _read("kernels", "yoso_checks.h")).groups()
    assert _spec.DIRECTIONS == (_spec.ANTICAUSAL, _spec.BIDIRECTIONAL, _spec.CAUSAL) == tuple(range(int(low),
                                                                                                   int(high) + 1))
    assert [_spec.transposed_direction(d) for d in _spec.DIRECTIONS] == [_spec.CAUSAL, _spec.BIDIRECTIONAL,
                                                                        _spec.ANTICAUSAL]
    for primitive in _spec.PRIMITIVES.values():
        for attribute in primitive.attributes:
            if attribute.name == "causal":
                assert attribute.default == _spec.BIDIRECTIONAL, primitive.name
