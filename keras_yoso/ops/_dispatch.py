"""The one place that decides how each op call runs.

A *provider* is a module with the forward primitives of every op, all with the same signatures
(see `composite`): `hash_codes`, `lsh_cumulation`, `weighted_lsh_cumulation`,
`collision_cumulation`. Two exist:

- `composite`: `keras.ops`, every backend, portable (XLA, SavedModels that load without
  keras_yoso, JAX, torch);
- the running backend's custom ops, today TensorFlow's (`_tf_kernels`: the C++/CUDA kernels).

The public functions of `keras_yoso.ops` ask `provider(implementation)` per call and wrap the
primitives with gradients (`keras.ops.custom_gradient`), so a JAX (XLA FFI) or torch kernel is
added by registering one more native provider in `_NATIVE_PROVIDERS`, without touching the ops'
math or the layers.
"""

import contextlib
import contextvars
import importlib

from keras_yoso import _runtime
from keras_yoso import _validation
from keras_yoso.ops import composite

# backend name -> module of its custom-op provider. The module has `load_error()` (None when its
# kernels are usable), `usable_here()` (False where they must not run, e.g. inside XLA) and the
# primitives.
_NATIVE_PROVIDERS = {"tensorflow": "keras_yoso.ops._tf_kernels"}


# Set by `composite_only()`: every op runs on the composite, whatever implementation it was given.
_COMPOSITE_ONLY = contextvars.ContextVar("keras_yoso_composite_only", default=False)


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


def native_provider():
    """(module, None) of the running backend's custom ops, or (None, why they are unavailable)."""
    name = _NATIVE_PROVIDERS.get(_runtime.backend())
    if name is None:
        return None, f"keras_yoso has no custom ops for the {_runtime.backend()} backend (only for tensorflow)"
    module = importlib.import_module(name)
    error = module.load_error()
    return (None, error) if error else (module, None)


def custom_ops_available():
    """True when the running backend's custom ops are loaded."""
    return native_provider()[0] is not None


def provider(implementation):
    """The provider that runs an op called with `implementation`.

    "custom_op": the backend's custom ops (RuntimeError when they are not loaded); "composite":
    `keras.ops`; "auto": the custom ops when loaded and usable in the current context (not under
    XLA, not where determinism needs the composite), else the composite.
    """
    _validation.choice(implementation, "implementation", _validation.IMPLEMENTATIONS)
    if implementation == "composite" or _COMPOSITE_ONLY.get():
        return composite
    native, error = native_provider()
    if implementation == "custom_op":
        if native is None:
            raise RuntimeError(f"implementation='custom_op' but the keras_yoso op library is not loaded: {error}")
        return native
    return native if native is not None and native.usable_here() else composite


def is_composite(module):
    return module is composite
