"""The one place that decides how each op call runs.

A *provider* (`providers/base.py`) runs the primitives of every op and declares what it can do.
There is the composite (`providers/composite.py`: `keras.ops`, every backend) and one native provider
per backend (`_NATIVE_PROVIDERS`): TensorFlow's op library, and the native library's CPU and CUDA
kernels on JAX (XLA FFI) and PyTorch (torch.library). The public functions of `keras_yoso.ops` ask
`provider(implementation, tensors, causal, primitives)` per call, naming the primitives the call
runs, wrap them with gradients (`keras.ops.custom_gradient`) and read the provider's declarations;
the layers ask `supports_jit(implementation)`. `kernels_table()` says, per primitive and device,
which provider "auto" takes.
"""

import contextlib
import contextvars
import importlib

from keras_yoso import _backend
from keras_yoso import _validation
from keras_yoso.ops import _spec
from keras_yoso.ops.parallel import sequence_sharded
from keras_yoso.ops.parallel import mesh
from keras_yoso.ops.providers import composite

# backend name -> module whose PROVIDER holds that backend's native kernels.
_NATIVE_PROVIDERS = {
    "tensorflow": "keras_yoso.ops.providers.tensorflow",
    "jax": "keras_yoso.ops.providers.jax",
    "torch": "keras_yoso.ops.providers.torch",
}


# Set by `composite_only()`: every op runs on the composite, whatever implementation it was given.
_COMPOSITE_ONLY = contextvars.ContextVar("keras_yoso_composite_only", default=False)


@_backend.constant_while_traced
def _composite_only_active():
    return _COMPOSITE_ONLY.get()


@contextlib.contextmanager
def composite_only():
    """Inside this context every keras_yoso op runs on the `keras.ops` composite, whatever
    `implementation` the op or layer was given: graphs traced here (e.g. by `model.export`) hold no
    custom op, so they load and run without keras_yoso."""
    token = _COMPOSITE_ONLY.set(True)
    try:
        yield
    finally:
        _COMPOSITE_ONLY.reset(token)


# backend name -> (provider, None) or (None, why not): looked up once per process, so that calls
# traced by torch.compile read a dict instead of importing.
_NATIVE = {}


def native_provider():
    """(provider, None) of the running backend's native kernels, or (None, why they are unavailable)."""
    backend = _backend.backend()
    if backend not in _NATIVE:
        _NATIVE[backend] = _load_native_provider(backend)
    return _NATIVE[backend]


def _load_native_provider(backend):
    name = _NATIVE_PROVIDERS.get(backend)
    if name is None:
        return None, f"keras_yoso has no native kernels for the {backend} backend"
    native = importlib.import_module(name).PROVIDER
    error = native.load_error()
    return (None, error) if error else (native, None)


def custom_ops_available():
    """True when the running backend's native kernels are loaded."""
    return native_provider()[0] is not None


def provider(implementation, tensors=(), causal=_spec.BIDIRECTIONAL, primitives=()):
    """The provider that runs an op called with `implementation` on `tensors`, running `primitives`
    (names of `_spec.PRIMITIVES`) on the device of `tensors`.

    "custom_op": the backend's native kernels (RuntimeError when they are not loaded, ValueError
    naming the device when they do not serve it, or the first of `primitives` without a kernel
    there, e.g. a `causal` call on a GPU);
    "composite": `keras.ops`; "auto": the native kernels when loaded, usable in the current
    context (not inside a TensorFlow XLA graph, not where determinism needs the composite) and
    running every one of `primitives` on the device of `tensors`, else the composite.
    """
    _validation.choice(implementation, "implementation", _validation.IMPLEMENTATIONS)
    if implementation == "composite" or _composite_only_active():
        return composite.PROVIDER
    native, error = native_provider()
    if implementation == "custom_op":
        if native is None:
            raise RuntimeError(f"implementation='custom_op' but the keras_yoso native kernels are not loaded: {error}")
        device_error = native.device_error(tensors, causal, primitives)
        if device_error:
            raise ValueError(f"implementation='custom_op' cannot run here: {device_error}")
        return native
    if native is None or not native.usable_here() or native.device_error(tensors, causal, primitives):
        return composite.PROVIDER
    return native


def kernels_table(causal=_spec.BIDIRECTIONAL):
    """{primitive: {device: provider name}}: for each primitive of `_spec.PRIMITIVES` and each device
    of `_spec.DEVICES`, what "auto" runs it on there in this process ("custom_op" or "composite") for
    a call with `causal`, outside any compiled function."""
    native, _ = native_provider()
    return {name: {device: "custom_op" if native is not None and native.runs(name, device, causal) else "composite"
                   for device in _spec.DEVICES}
            for name in _spec.PRIMITIVES}


def supports_jit(implementation="auto"):
    """True when ops called with `implementation` run inside compiled functions (XLA on TensorFlow
    and JAX, torch.compile): the composite and the JAX and PyTorch native kernels do; TensorFlow's
    op library does not (it has no XLA kernels). Layers set their `supports_jit` from this; where
    "custom_op" cannot run at all, the call raises the reason, and this says False."""
    try:
        return provider(implementation).supports_jit
    except (RuntimeError, ValueError):
        return False


def on_mesh(provider, fn, args, roles, out_roles, split_sequence=True, pointwise=False):
    """`fn(provider, *args)`, placed on the active device mesh (`mesh.plan()`).

    Outside a distribution (or on TensorFlow and PyTorch, whose engines replicate the whole call
    per device) this is the call itself. On a JAX mesh the call runs inside `jax.shard_map`
    (`mesh.run`; `roles` and `out_roles` name each axis "batch", "seq" or None) when the
    provider's kernels cannot be partitioned by XLA (native custom calls: data parallel, per
    block of the batch) or when the mesh splits the sequence and `split_sequence` is True: then
    `fn` gets a `parallel/sequence_sharded.SequenceShardedProvider`, which adds the other blocks'
    contributions through bucket tables (ValueError when a sequence length does not divide
    over the sequence axis). With `split_sequence=False` the sequence stays whole on each device.
    `pointwise=True` (a per-position op, e.g. hashing) splits the sequence only where it divides
    (one decoding token stays whole) and never needs the other blocks.
    """
    active = mesh.plan()
    if active is None:
        return fn(provider, *args)
    lengths = [_backend.static_shape(arg)[role.index("seq")] for arg, role in zip(args, roles) if "seq" in role]
    split = split_sequence and active.seq is not None
    if split and pointwise and any(n is None or n % active.seq_size for n in lengths):
        split = False
    if provider.partitioned_by_xla and (pointwise or not split):
        return fn(provider, *args)  # XLA partitions it itself: no cross-position terms between the blocks
    if not split:
        roles, out_roles = _whole_sequence(roles), _whole_sequence(out_roles)
    elif not pointwise:
        for length in lengths:
            mesh.sequence_length_check(active, length, "a sequence")
        provider = sequence_sharded.SequenceShardedProvider(provider, active.seq, active.seq_size)
    return mesh.run(active, lambda *blocks: fn(provider, *blocks), args, roles, out_roles)


def _whole_sequence(roles):
    """`roles` (one tuple, or a list of tuples) with the "seq" axes kept whole."""
    if roles and isinstance(roles[0], tuple):
        return [_whole_sequence(role) for role in roles]
    return tuple(None if r == "seq" else r for r in roles)
