"""tests/gpu/verify.py's layer timing on JAX (`_layer_timings` with `time_jax_layer`), here on the CPU at
small widths and two lengths: prints its table as JSON, {length: {"yoso_ms", "yoso_mib", "mha_ms", ...}}.

    KERAS_BACKEND=jax python tests/programs/verify_layer_memory.py
"""

import importlib.util
import json
import os

import jax

spec = importlib.util.spec_from_file_location(
    "gpu_verify", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu", "verify.py"))
verify = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verify)
verify.LAYER_TIMING = dict(verify.LAYER_TIMING, lengths=(256, 1024), num_heads=2, key_dim=16, num_hashes=8)


class Record:
    """What the stage functions use of verify.py's stage record: a budget, checks and saves."""

    def remaining(self):
        return 600.0

    def check(self, passed, message):
        assert passed, message

    def save(self):
        pass


record = Record()
cpu = jax.devices("cpu")[0]
table = verify._layer_timings(record, lambda layer, length: verify.time_jax_layer(layer, length, cpu, record))
print(json.dumps(table))
