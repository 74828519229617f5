"""The primitive table (keras_yoso/ops/_spec.py) against the native code it describes: the C ABI
header, the TensorFlow REGISTER_OPs and the XLA FFI handler bindings. Read as text, so this runs
without building anything; a primitive added or changed on one side only fails here."""

import os
import re

import pytest

from keras_yoso.ops import _spec

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "custom_ops", "cc")
# The C type of each argument kind of an entry.
C_TYPES = {"int": "int64_t", "float": "float"}
# The REGISTER_OP type of each input kind ("rows" take the op's dtype attr T).
TF_TYPES = {"mask": "float", "codes": "int32", "rows": "T", "float32": "float", "tables": "float"}


def _read(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def _c_entries():
    """entry name -> [(C type, argument name)] of every `KY_EXPORT int32_t ky_...(...)` declaration."""
    header = re.sub(r"/\*.*?\*/", "", _read("c_api", "yoso_c_api.h"), flags=re.S)
    entries = {}
    for name, arguments in re.findall(r"KY_EXPORT int32_t (ky_\w+)\(([^)]*)\);", header):
        parsed = [re.match(r"(.*?)\s*(\w+)$", a.strip()).groups() for a in arguments.split(",") if a.strip()]
        entries[name] = [(" ".join(t.split()), n) for t, n in parsed]
    return entries


def _registered_ops():
    """op name -> ([(input, type)], {attr: "type[ = default]"}, [(output, type)]) of every REGISTER_OP."""
    source = _read("tf", "yoso_ops.cc")
    ops = {}
    for name, body in re.findall(r'REGISTER_OP\("(\w+)"\)(.*?);', source, flags=re.S):
        inputs = re.findall(r'\.Input\("(\w+): (\w+)"\)', body)
        attrs = dict(re.findall(r'\.Attr\("(\w+): ([^"]+)"\)', body))
        ops[name] = (inputs, attrs, re.findall(r'\.Output\("(\w+): (\w+)"\)', body))
    return ops


def _ffi_handlers():
    """handler symbol -> (buffer arguments, results), read from XLA_FFI_DEFINE_HANDLER_SYMBOL (the
    Hadamard handlers are defined through one macro: they take its counts)."""
    source = _read("jax", "yoso_xla_ffi.cc")
    counts = {}
    for symbol, binding in re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\((\w+),.*?Bind\(\)(.*?)\);", source, flags=re.S):
        counts[symbol] = (binding.count(".Arg<"), binding.count(".Ret<"))
    macro = re.search(r"#define (\w+)\(symbol, entry\)(.*?)\n\n", source, flags=re.S)
    for symbol in re.findall(macro.group(1) + r"\((\w+), \w+\)", source) if macro else []:
        counts[symbol] = (macro.group(2).count(".Arg<"), macro.group(2).count(".Ret<"))
    return counts


@pytest.mark.parametrize("name", sorted(_spec.PRIMITIVES))
def test_each_primitive_is_the_c_abi_entry_of_the_same_name_arguments_and_order(name):
    primitive = _spec.PRIMITIVES[name]
    entries = _c_entries()
    assert primitive.entry in entries, f"yoso_c_api.h declares no {primitive.entry}"
    expected = ([("const KyTensor*", t.name) for t in primitive.inputs]
                + [(C_TYPES[a.kind], a.name) for a in primitive.attributes]
                + [("KyTensor*", out.name) for out in primitive.outputs]
                + [("int32_t", "num_threads"), ("char*", "error"), ("int64_t", "error_size")])
    declared = entries[primitive.entry]
    assert len(declared) == len(expected), (declared, expected)
    for (want_type, want_name), (got_type, got_name) in zip(expected, declared):
        assert got_type == want_type, (primitive.entry, got_name, got_type, want_type)
        # An entry's single output may be named for what it holds (codes) or "output".
        assert got_name == want_name or len(primitive.outputs) == 1 and got_name in ("output", "codes"), (
            primitive.entry, got_name, want_name)


def test_every_c_abi_entry_that_takes_tensors_is_a_primitive_of_the_table():
    with_tensors = {n for n, arguments in _c_entries().items() if any("KyTensor" in t for t, _ in arguments)}
    assert with_tensors == {p.entry for p in _spec.PRIMITIVES.values()}


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


@pytest.mark.parametrize("name", sorted(_spec.PRIMITIVES))
def test_each_primitive_has_an_xla_ffi_handler_with_one_buffer_per_input_and_output(name):
    primitive = _spec.PRIMITIVES[name]
    handlers = _ffi_handlers()
    assert handlers.get(primitive.handler) == (len(primitive.inputs), len(primitive.outputs)), (primitive.handler,
                                                                                                handlers)


def test_a_tensor_name_has_one_mesh_role_across_the_primitives():
    names = {t.name for p in _spec.PRIMITIVES.values() for t in p.inputs}
    for name in names:
        assert _spec.roles(name)
    assert _spec.roles("query_codes") == _spec.CODES_ROLES and _spec.roles("value") == _spec.ROWS_ROLES
