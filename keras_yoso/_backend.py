"""What keras-yoso needs to know about the running Keras backend, in one place.

Everything else is written in `keras.ops`. This module is the only one that looks at the
backend's own tensors (TensorFlow graphs, JAX tracers, torch tensors), for three things
`keras.ops` does not express:

- tensor checks that can only run when the data or a dim is known: eagerly they raise now;
  in a TensorFlow graph whose dims are unknown they become run-time assertions with the same
  message (`tf.errors.InvalidArgumentError`); in traced JAX code they cannot run at all;
- whether the current graph is compiled by XLA (where TensorFlow assertions vanish);
- the exception type of a failed data check: `tf.errors.InvalidArgumentError` on TensorFlow
  (as the custom ops raise it), `ValueError` elsewhere.

TensorFlow, JAX and torch are imported lazily, only when the backend is theirs.
"""

import contextlib

import keras
import numpy as np
from keras import ops
# Keras' own flag for "inferring output shapes" (compute_output_spec): not in its public API.
from keras.src.backend.common.symbolic_scope import in_symbolic_scope


def backend():
    return keras.backend.backend()


def is_tensorflow():
    return backend() == "tensorflow"


def _tf():
    import tensorflow as tf

    return tf


def is_symbolic(x):
    """True for a tensor without a value yet: a TensorFlow graph tensor or a JAX tracer."""
    name = backend()
    if name == "tensorflow":
        tf = _tf()
        return isinstance(x, tf.Tensor) and not hasattr(x, "numpy") or isinstance(x, keras.KerasTensor)
    if name == "jax":
        import jax

        return isinstance(x, jax.core.Tracer)
    return isinstance(x, keras.KerasTensor)


def has_values(x):
    """True when the values of `x` can be read now, at the cost of a reduction and a read back (NumPy
    arrays, lists, eager tensors); False for tensors without values (Keras symbolic tensors, TensorFlow
    graph tensors, JAX tracers, PyTorch meta tensors) and while Keras infers output shapes or
    torch.compile traces, where reading them would add work or a graph break for nothing. Eager-only
    input checks (soft masks, token ids) test it first."""
    if isinstance(x, (np.ndarray, list, tuple, int, float)):
        return True
    if isinstance(x, keras.KerasTensor) or is_symbolic(x) or in_symbolic_scope():
        return False
    if backend() == "torch":
        import torch

        return not (getattr(x, "is_meta", False) or torch.compiler.is_compiling())
    return True


def eagerly():
    """A context in which ops on values known now (NumPy arrays, eager tensors; `has_values`) run eagerly
    even while a function is traced: `jax.ensure_compile_time_eval` inside `jax.jit`, `tf.init_scope`
    inside a `tf.function`. An eager-only input check reduces and reads back there, instead of adding
    graph ops whose result cannot be read."""
    name = backend()
    if name == "jax":
        import jax

        return jax.ensure_compile_time_eval()
    if name == "tensorflow":
        return _tf().init_scope()
    return contextlib.nullcontext()


def in_xla_context():
    """True while a graph is traced that XLA will compile: TensorFlow's `jit_compile=True`, and all
    traced JAX code (there, TensorFlow-style run-time assertions do not exist)."""
    name = backend()
    if name == "tensorflow":
        from tensorflow.python.ops import control_flow_util

        return control_flow_util.GraphOrParentsInXlaContext(_tf().compat.v1.get_default_graph())
    return False


def static_shape(x):
    """The shape of `x` as a tuple, None for dims unknown while a graph is built (None: unknown rank)."""
    shape = getattr(x, "shape", None)
    if shape is None:
        return np.shape(x)
    if is_tensorflow() and hasattr(shape, "rank"):
        return None if shape.rank is None else tuple(shape.as_list())
    return tuple(None if d is None else int(d) for d in shape)


def run_time_shape(x):
    """The shape of `x` as a tuple of its dims: ints where known now, and in a TensorFlow graph (not
    compiled by XLA) scalar int tensors for the dims known only when it runs, for messages of run-time
    assertions (`text`); None where a dim stays unknown (XLA drops those assertions)."""
    shape = static_shape(x)
    if shape is None or None not in shape or not is_tensorflow() or in_xla_context():
        return shape
    dims = _tf().shape(x)
    return tuple(dims[axis] if dim is None else dim for axis, dim in enumerate(shape))


def text(parts):
    """`parts` (strs, ints, None, and scalar tensors of a TensorFlow graph from `run_time_shape`) joined
    into one message: a str when no part is a graph tensor, else a string tensor whose value is the text
    when the graph runs (the message of a run-time assertion, `check`)."""
    if not any(is_symbolic(part) for part in parts):
        return "".join(str(part) for part in parts)
    tf = _tf()
    return tf.strings.join([tf.strings.as_string(part) if is_symbolic(part) else str(part) for part in parts])


def data_error(message):
    """The exception of a check that needs the data (codes in range, a padding mask)."""
    if is_tensorflow():
        return _tf().errors.InvalidArgumentError(None, None, message)
    return ValueError(message)


def check(condition, message, error=None):
    """Checks the boolean scalar `condition` when it can. Returns the run-time assertions to make the
    result depend on (`after`): none eagerly (it raises `error` or `data_error(message)` now);
    one TensorFlow assertion in a TensorFlow graph (`message` may then be a string tensor, `text`);
    none in traced JAX code, which cannot assert (callers that must not skip a check test `can_check`
    first)."""
    if not is_symbolic(condition):
        if not bool(ops.convert_to_numpy(condition)):
            raise error if error is not None else data_error(message)
        return []
    if is_tensorflow():
        return [_tf().debugging.Assert(condition, [message])]
    return []


def can_check(x):
    """False where a data-dependent check on `x` cannot raise: traced JAX code and TensorFlow graphs
    compiled by XLA (which drops assertions)."""
    if backend() == "jax":
        return not is_symbolic(x)
    return not in_xla_context()


def after(checks, tensors):
    """`tensors`, made to run after the TensorFlow assertions `checks` (unchanged when there are none)."""
    if not checks:
        return tensors
    tf = _tf()
    with tf.control_dependencies(checks):
        return [tf.identity(t) for t in tensors]


def upstream_gradient(args, upstream):
    """The output gradient a `keras.ops.custom_gradient` grad function receives: `upstream=` on TensorFlow,
    its first positional argument on JAX and torch."""
    return args[0] if upstream is None else upstream


def ensure_rank(x, rank):
    """A TensorFlow tensor of unknown rank, checked to have `rank` when the graph runs
    (tf.ensure_shape's InvalidArgumentError)."""
    return _tf().ensure_shape(x, [None] * rank)


def dims_equal_at_run_time(entries, what):
    """Run-time assertions that the dims of entries [(label, tensor, axis)] agree, for dims unknown
    while a TensorFlow graph is built; message `<what> must agree: <label> differs from <ref>`."""
    shapes = [static_shape(t)[axis] for _, t, axis in entries]
    if all(d is not None for d in shapes) or not is_tensorflow():
        return []
    tf = _tf()
    ref = next((k for k, d in enumerate(shapes) if d is not None), 0)
    ref_label, ref_tensor, ref_axis = entries[ref]
    ref_dim = shapes[ref] if shapes[ref] is not None else tf.shape(ref_tensor)[ref_axis]
    return [tf.debugging.assert_equal(tf.shape(t)[axis], ref_dim,
                                      message=f"{what} must agree: {label} differs from {ref_label}")
            for k, ((label, t, axis), d) in enumerate(zip(entries, shapes)) if k != ref and d is None]


def assert_in_range(x, low, high, message):
    """Run-time assertions that low <= x < high elementwise (TensorFlow graphs; eagerly it raises now)."""
    ok = ops.logical_and(ops.all(ops.greater_equal(x, low)), ops.all(ops.less(x, high)))
    return check(ok, message)


def random_seed_dtype():
    """The dtype `keras.random` expects of a seed tensor on this backend."""
    return {"jax": "uint32", "tensorflow": "int64"}.get(backend(), "int32")


def compiled(static_argnames):
    """Decorator: on JAX, the function compiled with `jax.jit` (cached per shape and static
    arguments; eager JAX would otherwise re-trace its loops and conditionals on every call);
    elsewhere the function itself."""

    def decorate(fn):
        cache = {}

        def run(*args, **kwargs):
            if backend() != "jax":
                return fn(*args, **kwargs)
            if "jit" not in cache:
                import jax

                cache["jit"] = jax.jit(fn, static_argnames=static_argnames)
            return cache["jit"](*args, **kwargs)

        run.__doc__, run.__name__, run.__wrapped__ = fn.__doc__, fn.__name__, fn
        return run

    return decorate


def segment_sum(data, segment_ids, num_segments):
    """Rows of `data` [N, F] summed into `num_segments` rows by `segment_ids` [N] (ids in range).

    `keras.ops.segment_sum`, except on torch, where it replicates the ids over every feature and
    scatter-reduces (about 10x slower and F times the index memory): there `index_add_`."""
    if backend() == "torch":
        import torch

        out = torch.zeros((num_segments,) + tuple(data.shape[1:]), dtype=data.dtype, device=data.device)
        return out.index_add_(0, segment_ids.long(), data)
    return ops.segment_sum(data, segment_ids, num_segments=num_segments)


def constant_while_traced(fn):
    """`fn`, marked so that torch.compile calls it once while tracing and keeps its result as a
    constant of the graph (no graph break; it is read again only when the function is retraced)."""
    if backend() == "torch":
        import torch

        return torch.compiler.assume_constant_result(fn)
    return fn


def traced_as_opaque_call(fn):
    """`fn` (int/str arguments -> a tensor), marked so that torch.compile records it as one call
    instead of tracing its Python (e.g. NumPy's RandomState; torch >= 2.7)."""
    if backend() == "torch":
        import torch

        mark = getattr(torch._dynamo, "nonstrict_trace", None)
        return fn if mark is None else mark(fn)
    return fn


def stable_argsort(x):
    """Indices that sort `x` along its last axis, equal elements kept in their input order (int32).

    `keras.ops.argsort` is stable on JAX and torch but not on TensorFlow (`tf.argsort(stable=False)`);
    the causal cumulations need the order of equal codes to be the order of positions."""
    if backend() == "tensorflow":
        import tensorflow as tf

        return tf.argsort(x, axis=-1, stable=True)
    return ops.cast(ops.argsort(x, axis=-1), "int32")


def exclusive_cumsum(x, axis):
    """sum_{t' < t} x[..., t', ...] along `axis`, exactly: a shifted cumsum (cumsum - x would carry the
    rounding of x[t] itself, e.g. of a chunk's future keys, into causal outputs)."""
    before = (slice(None),) * axis
    zeros = ops.zeros_like(x[before + (slice(0, 1),)])
    return ops.concatenate([zeros, ops.cumsum(x, axis=axis)[before + (slice(None, -1),)]], axis=axis)


def compile_reading_variables(fn, variables):
    """`fn(*args)` compiled once for the running backend, reading the current values of `variables`
    (e.g. a model's weights) at every call: on JAX `jax.jit` of `fn` under a `keras.StatelessScope`
    that maps each variable to a value passed as an argument (so a weight updated after compiling
    is read, not a constant of the first trace); on TensorFlow `tf.function` (no XLA: the
    TensorFlow op library has no XLA kernels; variables are read when it runs); on torch `fn`
    itself (eager). Shapes of new arguments retrace as the backend does."""
    if backend() == "jax":
        import jax

        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return fn(*args)

        compiled = jax.jit(stateless)
        return lambda *args: compiled([v.value for v in variables], *args)
    if backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)
    return fn
