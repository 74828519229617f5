"""The LRA sequence classifier shared by long_text_classifier.py and listops.py, on every Keras backend.

Both examples train the Long Range Arena classifier of YOSO's appendix Table 4 (Tay et al. 2021):
token + learned position embedding -> `num_layers` pre-LN `keras_yoso.TransformerEncoderBlock`s ->
final LayerNorm -> masked mean pooling -> Dense(ffn_dim, relu) -> Dense(num_classes, softmax).
They differ only in their data and tokenizer. This package holds everything else, a module a role:

- command_line.py: the command-line options of the model and of training (`--preset lra`:
  appendix Table 4), and their checks;
- tokenizers.py: tokenizers to NumPy token ids (bytes, whitespace words; wordpiece needs tensorflow-text);
- batches.py: splits, and length-bucketed batches (`keras.utils.PyDataset`): the batch of training
  step s is a fixed function of --seed and s, so training split into pieces (`--checkpoint-dir`,
  `--stop-after-steps`) is the same training as one run;
- model.py, optimizer.py: the classifier and its layers; Adam with dense gradients and its schedule;
- training.py: `model.fit` in intervals of --eval-every steps, with validation after each
  (evaluation.py), checkpoints (checkpoint.py) and progress lines (progress.py); outputs.py writes
  the outputs to --output-dir;
- device_mesh.py: `--mesh data=D,seq=S` (scripts that call `add_mesh_argument`; JAX only): the same
  training run data and sequence parallel on D*S devices under
  `keras_yoso.distribution.SequenceParallel` (`mesh_distribution`). The outputs:

    model.keras    the trained classifier, every backend (keras.saving.load_model)
    metrics.json   test accuracy and loss, examples/s, peak RSS, validation history, all arguments
    history.png    loss and accuracy vs training step (train: mean per interval; validation); a warning
                   instead when matplotlib is missing
    saved_model/   TensorFlow backend only: `serve` maps raw strings to class probabilities
                   (examples/text_serving.py), by default portable (no keras_yoso needed to serve)

Runs on TensorFlow, JAX and PyTorch (KERAS_BACKEND); TensorFlow's C++ start-up logs are silenced
unless --verbose (importing this package imports Keras: import it before anything else loads TensorFlow).
"""

import contextlib
import os
import sys


@contextlib.contextmanager
def _native_stderr_silenced(silence):
    """Sends file descriptor 2 to /dev/null while TensorFlow loads: its C++ start-up lines ("All log messages
    before absl::InitializeLog()", "Could not find cuda drivers") are written before TF_CPP_MIN_LOG_LEVEL is
    read. Python's own errors are unaffected: they print after the descriptor is restored."""
    if not silence:
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


with _native_stderr_silenced("--verbose" not in sys.argv):  # TensorFlow may be Keras' backend
    import keras  # noqa: E402

    import keras_yoso  # noqa: E402,F401

    if keras.backend.backend() == "tensorflow":  # its device set-up logs ("failed call to cuInit") come at first use
        keras.ops.convert_to_numpy(keras.ops.zeros(()))

# The public names, as the importers use them (`from sequence_classification import Split`).
from .batches import Batches, Split, bucket_boundaries, hold_out  # noqa: E402,F401
from .command_line import (ATTENTIONS, add_model_arguments, add_training_arguments,  # noqa: E402,F401
                           check_model_arguments, check_positive_arguments, check_training_arguments,
                           default_output_dir, parse_args)
from .device_mesh import (MESH_AXES, add_mesh_argument, check_mesh_arguments, mesh_devices,  # noqa: E402,F401
                          mesh_distribution, mesh_length_multiple, mesh_rows, parse_mesh)
from .evaluation import evaluate  # noqa: E402,F401
from .model import MaskedMeanPooling, TokenAndPositionEmbedding, build_classifier, encoder_attention  # noqa: E402,F401
from .optimizer import DenseGradientAdam, LinearWarmupLinearDecay  # noqa: E402,F401
from .outputs import RunResult  # noqa: E402,F401
from .progress import peak_rss_mib, plot_history, process_cpu_seconds  # noqa: E402,F401
from .tokenizers import PAD_ID, ByteTokenizer, WhitespaceTokenizer, WordpieceTokenizer  # noqa: E402,F401
from .training import train_and_export  # noqa: E402,F401
