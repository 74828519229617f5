"""examples/long_text_classifier.py --mesh: data and sequence parallel training on JAX.

The end-to-end test runs the example in a fresh JAX interpreter with 8 virtual CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8, set before jax starts), twice on the same
tiny built-in task and seed: on one device, and with --mesh data=2,seq=4 (each batch of 8 rows
split in 2 row blocks, each 64-word document in 4 blocks of 16 words). The two trainings are the
same computation up to float32 rounding: the same batches, initial weights, dropout masks (JAX's
threefry draws do not depend on how the array is sharded) and YOSO hash functions (one draw per
call, the same on every device), so the test asks the predictions to agree within 1e-4 (observed:
~1e-7). The mesh run's model.keras, loaded with no distribution, must predict what the mesh run's
classifier predicts on the mesh. A --checkpoint-dir run stopped and continued on the mesh must end
where the unsplit mesh run does.

The option errors are checked in this process (any backend) and, for the device count, in a
fresh JAX interpreter that starts JAX with one CPU device before calling main().
"""

import json
import os
import re
import sys

import numpy as np
import pytest

from conftest import BACKEND, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)

import long_text_classifier  # noqa: E402

TINY_MODEL = ["--num-layers", "1", "--hidden-dim", "16", "--ffn-dim", "16", "--num-heads", "2", "--num-hashes", "4",
              "--hash-code-len", "4", "--batch-size", "8", "--learning-rate", "1e-3"]

# The tiny built-in task: 24 documents of 64 words, a third held out (8 validation, 16 training:
# 2 full batches of 8 per pass), 8 test documents; every batch has 8 rows, so each function
# compiles once per run.
TINY_TASK = ["--train-examples", "24", "--validation-fraction", "0.34", "--test-examples", "8", "--max-length", "64",
             "--steps", "4", "--eval-every", "2", "--dropout", "0.1", "--seed", "1", "--export", "none"] + TINY_MODEL
MESH = ["--mesh", "data=2,seq=4"]

_END_TO_END = """
import argparse, json, sys
import numpy as np
sys.path.insert(0, __EXAMPLES__)
import keras
import long_range_data, long_text_classifier, sequence_classification

TINY_TASK, MESH = __TINY_TASK__, __MESH__
one = long_text_classifier.main(TINY_TASK + ["--output-dir", "one"])
mesh = long_text_classifier.main(TINY_TASK + MESH + ["--output-dir", "mesh"])
pieces = TINY_TASK + MESH + ["--output-dir", "pieces", "--checkpoint-dir", "checkpoint", "--stop-after-steps", "2"]
first = long_text_classifier.main(pieces)
last = long_text_classifier.main(pieces)
assert keras.distribution.distribution() is None

texts, _ = long_range_data.generate_documents(8, [1, 1], length=64)  # the run's test documents (seed 1)
ids = np.stack(sequence_classification.WhitespaceTokenizer(long_range_data.VOCABULARY, 64).encode(texts))
saved = keras.saving.load_model("mesh/model.keras")  # no distribution: one device
with sequence_classification.mesh_distribution(argparse.Namespace(mesh="data=2,seq=4")).scope():
    on_mesh = mesh.classifier.predict(ids, verbose=0)
with open("mesh/metrics.json") as f:
    written = json.load(f)
print(json.dumps({
    "one": one.classifier.predict(ids, verbose=0).tolist(),
    "saved": saved.predict(ids, verbose=0).tolist(),
    "on_mesh": on_mesh.tolist(),
    "resumed": keras.saving.load_model("pieces/model.keras").predict(ids, verbose=0).tolist(),
    "first_finished": first.finished,
    "one_metrics": {k: one.metrics[k] for k in ("test_loss", "test_accuracy", "history")},
    "written": {k: written[k] for k in ("test_loss", "test_accuracy", "history", "mesh", "invocations")},
    "resumed_invocations": last.metrics["invocations"],
}))
"""


def _fill(template, **values):
    for name, value in values.items():
        template = template.replace(f"__{name}__", repr(value))
    return template


@pytest.mark.other_backends
def test_mesh_training_matches_the_one_device_run_and_saves_a_model_that_needs_no_mesh(tmp_path):
    code = _fill(_END_TO_END, EXAMPLES=EXAMPLES, TINY_TASK=TINY_TASK, MESH=MESH)
    stdout = run_python(code, cwd=str(tmp_path), backend="jax",
                        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert "--mesh data=2,seq=4: data and sequence parallel on 8 cpu devices" in stdout
    result = json.loads(stdout.strip().splitlines()[-1])

    written = result["written"]
    assert written["mesh"]["data"] == 2 and written["mesh"]["seq"] == 4 and len(written["mesh"]["devices"]) == 8
    assert written["mesh"]["axis_names"] == ["batch", "seq"]
    assert written["history"]["step"] == [2, 4]
    losses = written["history"]["train_loss"] + written["history"]["val_loss"] + [written["test_loss"]]
    assert np.all(np.isfinite(losses)), written
    # The same training as on one device (float32 rounding), checked on the predictions and the metrics.
    np.testing.assert_allclose(result["on_mesh"], result["one"], atol=1e-4)
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(written["history"][key], result["one_metrics"]["history"][key], atol=1e-4,
                                   err_msg=key)
    assert written["test_loss"] == pytest.approx(result["one_metrics"]["test_loss"], abs=1e-4)
    assert written["test_accuracy"] == result["one_metrics"]["test_accuracy"]
    # model.keras of the mesh run serves without a distribution, predicting what it did on the mesh.
    np.testing.assert_allclose(result["saved"], result["on_mesh"], atol=1e-5)
    # Stopped after 2 steps and continued (checkpoint saved and loaded on the mesh): the unsplit run.
    assert result["first_finished"] is False and result["resumed_invocations"] == 2
    np.testing.assert_allclose(result["resumed"], result["saved"], atol=1e-5)


@pytest.mark.parametrize("argv, match", [
    (["--mesh", "data=2,sq=4"], r"--mesh data=2,sq=4: 'sq=4' is not an axis: write data=D,seq=S"),
    (["--mesh", "data=two"], r"data='two': the number of devices must be an integer"),
    (["--mesh", "data=2,seq=0"], r"seq=0: the number of devices must be >= 1"),
    (["--mesh", "data=2,seq=3", "--max-length", "64"],
     r"--max-length 64 must be a multiple of the seq axis of --mesh data=2,seq=3 \(3\)"),
    (["--mesh", "data=3,seq=4", "--max-length", "64", "--batch-size", "8"],
     r"--batch-size 8 must be a multiple of the data axis of --mesh data=3,seq=4 \(3\)"),
])
def test_bad_mesh_options_are_rejected_naming_the_numbers(argv, match, capsys):
    with pytest.raises(SystemExit) as exit_info:
        long_text_classifier.main(argv)
    assert exit_info.value.code == 2
    assert re.search(match, capsys.readouterr().err)


@pytest.mark.other_backends
def test_mesh_needs_the_jax_backend_and_enough_devices(tmp_path, capsys):
    if BACKEND != "jax":
        with pytest.raises(SystemExit) as exit_info:
            long_text_classifier.main(MESH + ["--max-length", "64"])
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert "--mesh (sequence parallelism, keras_yoso.distribution.SequenceParallel) needs KERAS_BACKEND=jax" \
            in error
        assert f"this is KERAS_BACKEND={BACKEND}" in error and "docs/distributed.md" in error
    # JAX started with one CPU device before main() could ask for 8: the error names both numbers.
    code = _fill("""
        import contextlib, io, sys
        sys.path.insert(0, __EXAMPLES__)
        import jax
        jax.devices()
        import long_text_classifier
        error = io.StringIO()
        try:
            with contextlib.redirect_stderr(error):
                long_text_classifier.main(["--mesh", "data=2,seq=4", "--max-length", "64"])
        except SystemExit as exit:
            print("exit", exit.code, error.getvalue())
        """, EXAMPLES=EXAMPLES)
    stdout = run_python(code, cwd=str(tmp_path), backend="jax", env={"XLA_FLAGS": ""})
    assert "exit 2" in stdout
    assert "--mesh data=2,seq=4 needs 2 x 4 = 8 devices, JAX has 1 (cpu)" in stdout
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=8" in stdout
