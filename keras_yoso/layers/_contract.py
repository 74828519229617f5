"""The call contract of keras_yoso's attention layers: what a caller may pass, checked before any
attention is computed.

`keras.layers.MultiHeadAttention`'s call arguments are written once, in the signature of
`MultiHeadAttentionBase.call` (Keras reads it there: `training`, and the `*_mask` arguments it fills
from Keras masks); `call_arguments` reads a call by that signature. The checks need no weights: the
dtypes of the inputs and masks, the inputs' ranks, features and attention axes, every shape relation
between query, value, key and the masks (a run-time assertion with the same message for dims unknown
in a TensorFlow graph, giving the dims it runs with), an `attention_mask` that must be a padding mask,
and the arguments of a decoding call. Errors name the argument, what was expected and what was
received; `name` is the layer's class name.
"""

import inspect

from keras import ops

from keras_yoso import _validation

_INPUT_ARGUMENTS = ("query", "value", "key")
_MASK_ARGUMENTS = ("query_mask", "value_mask", "key_mask", "attention_mask")

# (layout, dims) of each call argument checked against `query` and `value`: each dim is "batch" /
# "target" (from `query`) or "source" (from `value`), None for a dim of its own.
_CALL_LAYOUTS = {
    "value": ("(batch, source_length, features)", ("batch", None, None)),
    "key": ("(batch, source_length, features)", ("batch", "source", None)),
    "query_mask": ("(batch, target_length)", ("batch", "target")),
    "value_mask": ("(batch, source_length)", ("batch", "source")),
    "key_mask": ("(batch, source_length)", ("batch", "source")),
    "attention_mask": ("(batch, target_length, source_length)", ("batch", "target", "source")),
}
# The other layouts of an `attention_mask` that MultiHeadAttention takes, by rank: [T, S] (broadcast
# over the batch) and [B, H, T, S] ("heads": num_heads or 1; every head the same padding).
_ATTENTION_MASK_DIMS = {2: ("target", "source"), 4: ("batch", "heads", "target", "source")}


def call_arguments(call, args, kwargs):
    """The arguments of a call of the bound method `call` with `args` and `kwargs`, by name, the
    defaults of its signature filled in (TypeError as Python raises it for arguments it does not take)."""
    bound = inspect.signature(call).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def check_dtypes(arguments):
    """ValueError naming the argument for a data input (`query`, `value`, `key`) or a mask that is not
    numeric (strings). Run before Keras converts the call's arrays to tensors: on JAX and PyTorch a
    string would fail there with a message that names no argument."""
    for name in _INPUT_ARGUMENTS:
        if arguments.get(name) is not None:
            _validation.layer_input_dtype(arguments[name], name)
    for name in _MASK_ARGUMENTS:
        if arguments.get(name) is not None:
            _validation.mask_dtype(arguments[name], name, layer=True)


def attention_axes_argument(attention_axes):
    """`attention_axes` as MultiHeadAttention takes it (None, an int, or a list or tuple of ints) -> None or a
    tuple; else ValueError naming the argument."""
    if attention_axes is None:
        return None
    axes = (attention_axes,) if _validation.is_integer(attention_axes) else attention_axes
    if not isinstance(axes, (list, tuple)) or not axes or not all(_validation.is_integer(a) for a in axes):
        raise ValueError("Received an invalid value for argument `attention_axes`: expected None, an int, or a list "
                         f"or tuple of ints. Received: attention_axes={attention_axes!r}")
    return tuple(int(a) for a in axes)


def bool_mask(mask):
    """`mask` as a bool tensor (any nonzero keeps), None for None."""
    if mask is None:
        return None
    mask = ops.convert_to_tensor(mask)
    return mask if _validation.dtype_name(mask) == "bool" else ops.not_equal(mask, ops.zeros((), mask.dtype))


def normalized_attention_axes(attention_axes, rank):
    """The attention axes of inputs of `rank` as sorted non-negative axes in [1, rank - 2] (negative
    ones count from rank, as MultiHeadAttention counts them); default (None): every axis in between."""
    if attention_axes is None:
        return tuple(range(1, rank - 1))
    axes = sorted({axis + rank if axis < 0 else axis for axis in attention_axes})
    if len(axes) != len(attention_axes) or axes[0] < 1 or axes[-1] > rank - 2:
        raise ValueError(f"Received an invalid value for argument `attention_axes`: expected distinct axes of the "
                         f"inputs between the batch axis and the features, in [1, {rank - 2}] (or "
                         f"[{1 - rank}, -2]) for inputs of rank {rank}. Received: "
                         f"attention_axes={attention_axes}")
    return tuple(axes)


def attention_axes_split(attention_axes, rank):
    """(the other axes between batch and features, the attention axes) of inputs of `rank`."""
    axes = normalized_attention_axes(attention_axes, rank)
    return [axis for axis in range(1, rank - 1) if axis not in axes], axes


def check_shapes(name, attention_axes, query_shape, value_shape, key_shape, sequences=False):
    """The rank and feature checks of build (and of calls): ValueError naming the argument. Inputs of
    rank 3 `(batch, length, features)`, or of any rank >= 3 `(batch, *dims, features)` with the
    attention over `attention_axes` of dims (MultiHeadAttention's layout); `sequences`: the
    `(batch, length, features)` inputs the attention axes were flattened to."""
    if value_shape is not None and key_shape is not None and (
            len(value_shape) != len(key_shape) or any(
                a is not None and b is not None and a != b for a, b in zip(value_shape[:-1], key_shape[:-1]))):
        raise ValueError("All dimensions of `value` and `key`, except the last one, must be equal. "
                         f"Received: value_shape={tuple(value_shape)} and key_shape={tuple(key_shape)}")
    for arg, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
        if shape is None or len(shape) < 3:
            raise ValueError(f"{name} expects `{arg}` of shape (batch, length, features) (or (batch, *dims, "
                             f"features) with attention_axes), got shape {None if shape is None else tuple(shape)}")
        if shape[-1] is None:
            raise ValueError(f"The last dimension of `{arg}` must be known, got shape {tuple(shape)}")
    if len(value_shape) != len(query_shape):
        raise ValueError(f"{name} expects `query` and `value` of the same rank (the attention axes and the other "
                         "axes of both line up). Received: query_shape="
                         f"{tuple(query_shape)} and value_shape={tuple(value_shape)}")
    axes = (1,) if sequences else normalized_attention_axes(attention_axes, len(query_shape))
    for axis in range(1, len(query_shape) - 1):
        q, v = query_shape[axis], value_shape[axis]
        if axis not in axes and None not in (q, v) and v not in (1, q):
            raise ValueError(f"{name}: axis {axis} is not an attention axis, so `value` must match `query` there "
                             f"(or be 1, broadcast). Received: query_shape={tuple(query_shape)} and "
                             f"value_shape={tuple(value_shape)} with attention_axes={axes}")


def check_call_shapes(name, num_heads, query, value, key, masks, attention_mask):
    """Every shape relation between a call's `(batch, length, features)` inputs and its masks
    (`masks`: name -> bool mask or None): ValueError naming the argument, the expected shape and the
    received one, before anything is computed when the shapes are known; a run-time assertion for
    dims unknown in a TensorFlow graph, whose message gives the dims the graph runs with. Returns the
    assertions. (An `attention_mask` dim of 1 broadcasts.)"""
    shape = _validation.static_shape
    sources = {"batch": (query, 0), "target": (query, 1), "source": (value, 1)}
    tensors = {"value": value, "key": key, **{k: v for k, v in masks.items() if v is not None}}
    if attention_mask is not None:
        tensors["attention_mask"] = ops.convert_to_tensor(attention_mask)
    checks = []
    for arg, tensor in tensors.items():
        layout, layout_dims = _CALL_LAYOUTS[arg]
        got = shape(tensor)
        message = _shape_message(name, num_heads, arg, layout, layout_dims, got, shape(query), shape(value))
        dims = layout_dims
        if arg == "attention_mask" and got is not None:
            dims = _ATTENTION_MASK_DIMS.get(len(got), dims)
        if got is None or len(got) != len(dims):
            raise ValueError(message)
        for axis, dim in enumerate(dims):
            if dim is None or (arg == "attention_mask" and got[axis] == 1):
                continue
            if dim == "heads":
                if got[axis] is not None and got[axis] != num_heads:
                    raise ValueError(message)
                continue
            ref, ref_axis = sources[dim]
            want = shape(ref)[ref_axis]
            if want is not None and got[axis] is not None:
                if want != got[axis]:
                    raise ValueError(message)
                continue
            actual, wanted = ops.shape(tensor)[axis], ops.shape(ref)[ref_axis]
            ok = ops.equal(actual, wanted)
            if arg == "attention_mask":
                ok = ops.logical_or(ok, ops.equal(actual, 1))
            # The lengths the graph runs with, where `message` can only say None.
            run_time = _shape_message(name, num_heads, arg, layout, layout_dims, _validation.run_time_shape(tensor),
                                      _validation.run_time_shape(query), _validation.run_time_shape(value))
            checks += _validation.run_time_check(ok, run_time, error=ValueError(message))
    return checks


def _tuple_text(dims):
    """The parts of the text of the tuple `dims` ("(2, 5)"; ints, names, None or run-time scalars) for
    `_validation.text`."""
    parts = ["("]
    for k, dim in enumerate(dims):
        parts += [", "] if k else []
        parts.append(dim)
    return parts + ([",)"] if len(dims) == 1 else [")"])


def _shape_message(name, num_heads, arg, layout, dims, got, query_shape, value_shape):
    """The message of a call-shape mistake of `arg`. The shapes are tuples of dims (ints, None where
    unknown, or the scalar tensors of `_validation.run_time_shape`: then the message is a string
    tensor that gives them when the graph runs); `got` None: unknown rank."""
    sizes = {"batch": query_shape[0], "target": query_shape[1], "source": value_shape[1]}
    names = layout.strip("()").split(", ")
    want = _tuple_text([label if dim is None or sizes[dim] is None else sizes[dim]
                        for label, dim in zip(names, dims)])
    if arg == "attention_mask":
        head = [f"{name} accepts `attention_mask` only of shape [batch, target_length, source_length] (a padding "
                "mask) = ", *want, " (a dim of 1 broadcasts; also [target_length, source_length], and [batch, "
                f"num_heads = {num_heads}, target_length, source_length] with the same mask in every head)"]
    else:
        head = [f"{name} expects `{arg}` of shape {layout} = ", *want]
    return _validation.text([*head, ", with batch and target_length from `query` ", *_tuple_text(query_shape),
                             " and source_length from `value` ", *_tuple_text(value_shape),
                             f". Received: `{arg}` of shape ", *(["None"] if got is None else _tuple_text(got))])


def padding_masks_from_attention_mask(name, reason, attention_mask, batch, query_length, key_length):
    """Splits a padding `[B, T, S]` attention mask into query and key masks, or raises (`reason`: why the
    layer takes padding masks only, a sentence).

    A padding mask is `query_pad[:, :, None] & key_pad[:, None, :]` (a key mask broadcast over
    every row is the case query_pad = all true).
    """
    attention_mask = bool_mask(attention_mask)
    if _validation.static_shape(attention_mask)[1] == 1:
        # [B, 1, S] (keras-hub's merged padding mask): a key mask broadcast over the rows is a padding
        # mask by its shape, so nothing is checked at run time (and XLA takes it). A batch row with no
        # key is also a padded query row, as the general split below reads it.
        key_pad = ops.broadcast_to(attention_mask[:, 0, :], (batch, key_length))
        query_pad = ops.broadcast_to(ops.any(key_pad, axis=1, keepdims=True), (batch, query_length))
        return query_pad, key_pad
    attention_mask = ops.broadcast_to(attention_mask, (batch, query_length, key_length))
    query_pad = ops.any(attention_mask, axis=2)
    key_pad = ops.any(attention_mask, axis=1)
    is_padding = ops.all(ops.equal(attention_mask, ops.logical_and(query_pad[:, :, None], key_pad[:, None, :])))
    message = (f"{name} received an `attention_mask` that is not a padding mask. "
               f"{reason}, so it can only express masks of the form "
               "query_mask[:, :, None] & key_mask[:, None, :]. Pass `query_mask`, `value_mask` and/or "
               "`key_mask` ([batch, length] padding masks) instead.")
    if not _validation.can_check(is_padding):
        # XLA drops run-time assertions and traced JAX code cannot raise: a causal or banded mask
        # would then be silently read as padding. Refuse at trace time instead.
        raise ValueError(f"{name} cannot check under XLA (jit_compile=True, or the JAX backend's compiled "
                         "train/predict steps) that `attention_mask` is a padding mask. Pass `query_mask`, "
                         "`value_mask` and/or `key_mask` ([batch, length] padding masks) instead, or compile "
                         "without XLA.")
    checks = _validation.run_time_check(is_padding, message, error=ValueError(message))
    return _validation.after_checks(checks, [query_pad, key_pad])


def three_dim_attention_mask(name, reason, attention_mask):
    """An `attention_mask` of a shape already checked as `[B, T, S]`: a `[T, S]` one broadcast over the
    batch, a `[B, H, T, S]` one as its first head once every head is seen to be the same (ValueError
    otherwise, or a run-time assertion in a TensorFlow graph)."""
    attention_mask = bool_mask(attention_mask)
    rank = len(_validation.static_shape(attention_mask))
    if rank == 2:
        return attention_mask[None]
    if rank != 4:
        return attention_mask
    first = attention_mask[:, :1]
    same = ops.all(ops.equal(attention_mask, first))
    message = (f"{name} received a 4-D `attention_mask` [batch, num_heads, target_length, "
               f"source_length] whose heads differ. {reason}, and its heads share one "
               "padding: pass the same mask for every head, or a [batch, target_length, source_length] mask.")
    checks = _validation.run_time_check(same, message, error=ValueError(message))
    return _validation.after_checks(checks, [first[:, 0]])[0]


def check_cache_call(name, query, value, key, attention_mask, return_attention_scores, cache_update_index):
    """The argument checks of a call with `cache`: ValueError naming the argument. Returns
    `cache_update_index` as an int32 scalar."""
    if cache_update_index is None:
        raise ValueError(f"{name} called with `cache` needs `cache_update_index`: the position (int or "
                         "scalar tensor) of the first of the `query` rows in the sequence. Received None.")
    if attention_mask is not None:
        raise ValueError(f"{name} called with `cache` takes no `attention_mask` (decoding is causal "
                         "self-attention over the positions seen so far; pass query_mask/value_mask for "
                         "padding of the new positions).")
    if return_attention_scores:
        raise ValueError(f"{name} called with `cache` cannot return attention scores.")
    shape = _validation.static_shape
    if key is not None and key is not value:
        raise ValueError(f"{name} called with `cache` is self-attention over the new positions: pass "
                         "`layer(query, query, cache=..., cache_update_index=...)` (no separate `key`).")
    if None not in (shape(query)[1], shape(value)[1]) and shape(query)[1] != shape(value)[1]:
        raise ValueError(f"{name} called with `cache` is self-attention: `value` must hold the same new "
                         f"positions as `query`. Received query of shape {tuple(shape(query))} and value of "
                         f"shape {tuple(shape(value))}.")
    index = cache_update_index
    if isinstance(index, (int, float)) and not isinstance(index, bool):
        if int(index) != index or index < 0:
            raise ValueError(f"`cache_update_index` must be a non-negative int position, received {index!r}")
        return ops.convert_to_tensor(int(index), "int32")
    index = ops.convert_to_tensor(index)
    if len(shape(index)) != 0 and shape(index) != (1,):
        raise ValueError("`cache_update_index` must be an int or a scalar tensor, received shape "
                         f"{tuple(shape(index))}")
    if not _validation.dtype_name(index).startswith(("int", "uint")):
        raise ValueError(f"`cache_update_index` must be an integer, received dtype {_validation.dtype_name(index)}")
    return ops.cast(ops.reshape(index, ()), "int32")
