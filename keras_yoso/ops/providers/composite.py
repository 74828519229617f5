"""The composite as a provider: the `keras.ops` algorithms of `keras_yoso.ops.composite`, every backend."""

import functools
import importlib

from keras import ops

from keras_yoso.ops import _spec
from keras_yoso.ops.composite.linear_relative import chunk_rows
from keras_yoso.ops.composite.linear_relative import total_rows
from keras_yoso.ops.providers import base


@functools.lru_cache(maxsize=None)
def _function(name):
    """The composite function of primitive `name`, as its row of the table names it
    ("family.function" in keras_yoso.ops.composite; same arguments, same order)."""
    module, function = _spec.PRIMITIVES[name].composite.rsplit(".", 1)
    return getattr(importlib.import_module(f"keras_yoso.ops.composite.{module}"), function)


class _CompositeProvider(base.Provider):
    """The composite as a provider: every backend, inside any compiled function; it cannot check
    codes in traced code (ops/yoso.py checks them where it can), and it chunks by num_hashes, which
    must therefore be known while tracing. Masks are bool; outputs float32."""

    name = "composite"
    checks_codes = False
    needs_static_num_hashes = True
    supports_jit = True
    partitioned_by_xla = True

    def run(self, name, *arguments):
        return _function(name)(*arguments)

    def device_of(self, tensors):
        return "any"

    def devices(self):
        return ("any",)

    def runs(self, name, device, causal=_spec.BIDIRECTIONAL):
        """Every primitive, on every device the backend computes on (so `device_error` finds none)."""
        return True

    def linear_relative_total(self, phi_q, phi_k, v, scores, horizon, causal, chunk_size):
        """Provider.linear_relative_total: composite/linear_relative.py."""
        return total_rows(phi_q, phi_k, v, scores, horizon, causal, chunk_rows(chunk_size, ops.shape(phi_q)[1]))


PROVIDER = _CompositeProvider()
