"""The outputs of a finished run: the test evaluation, model.keras, the raw-string SavedModel
(TensorFlow; text_serving.py), metrics.json and history.png."""

import dataclasses
import json
import os
import sys
import time

import keras
import numpy as np

import keras_yoso

from .batches import split_batches
from .device_mesh import mesh_metrics
from .evaluation import evaluate
from .progress import peak_rss_mib, plot_history, process_cpu_seconds


@dataclasses.dataclass
class RunResult:
    """What `train_and_export` returns: the contents of metrics.json ({} when --stop-after-steps stopped the
    run first), the classifier, the output folder, and whether all --steps are done."""

    metrics: dict
    classifier: keras.Model
    output_dir: str
    finished: bool


def finish_run(task, args, tokenizer, class_names, classifier, state, encoded, train, validation, test):
    """Test evaluation, then the outputs, most valuable first: model.keras (every backend), the SavedModel
    (TensorFlow), metrics.json, and last history.png (a plot that cannot be drawn only warns)."""
    test_batches = split_batches(args, encoded["test"], test)
    print(f"evaluating on {len(test)} test examples", flush=True)
    start, start_cpu = time.perf_counter(), process_cpu_seconds()
    test_loss, test_accuracy = evaluate(classifier, test_batches)
    test_seconds, test_cpu_seconds = time.perf_counter() - start, process_cpu_seconds() - start_cpu
    model_path = os.path.join(args.output_dir, "model.keras")
    classifier.save(model_path)
    export = _export(args, tokenizer, class_names, classifier)
    examples = args.steps * args.batch_size
    metrics = {
        "task": task,
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "validation_accuracy": state["history"]["val_accuracy"][-1],
        "validation_loss": state["history"]["val_loss"][-1],
        # What answering the most common class scores on the validation split: the floor a run must beat.
        "validation_majority_accuracy": float(np.bincount(validation.labels).max() / max(len(validation), 1)),
        "steps": args.steps,
        "train_examples_per_second": examples / max(state["train_seconds"], 1e-9),
        "test_examples_per_second": len(test) / max(test_seconds, 1e-9),
        "train_seconds": state["train_seconds"],
        "train_cpu_seconds": state["train_cpu_seconds"],
        "test_seconds": test_seconds,
        "test_cpu_seconds": test_cpu_seconds,
        "invocations": state["invocations"],
        "peak_rss_mib": peak_rss_mib(),
        "num_train_examples": len(train),
        "num_validation_examples": len(validation),
        "num_test_examples": len(test),
        "num_parameters": int(classifier.count_params()),
        "keras_backend": keras.backend.backend(),
        "yoso_ops": keras_yoso.ops.implementation_in_use(),
        "mesh": mesh_metrics(args),
        "model": model_path,
        "export": export,
        "class_names": list(class_names),
        "history": state["history"],
        "versions": {"keras": keras.__version__, "keras_yoso": keras_yoso.__version__,
                     keras.backend.backend(): _backend_version()},
        "command": [os.path.basename(sys.argv[0])] + sys.argv[1:],
        "args": vars(args),
    }
    with open(os.path.join(args.output_dir, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2)
    plot_history(state["history"], os.path.join(args.output_dir, "history.png"), f"{task}, attention={args.attention}, "
                 f"{keras.backend.backend()}")
    print(f"{task} attention={args.attention}: test accuracy {test_accuracy:.4f} (loss {test_loss:.4f}) on "
          f"{len(test)} examples | train {metrics['train_examples_per_second']:.1f} examples/s over "
          f"{state['train_seconds']:.0f} s, peak RSS {metrics['peak_rss_mib']:.0f} MiB | trained model: {model_path} "
          f"(keras.saving.load_model, any backend, after importing keras_yoso and this example's modules) | "
          f"{args.output_dir}", flush=True)
    return RunResult(metrics, classifier, args.output_dir, finished=True)


def _backend_version():
    name = keras.backend.backend()
    module = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}.get(name)
    return getattr(__import__(module), "__version__", "?") if module else "?"


def _export(args, tokenizer, class_names, classifier):
    """Exports the raw-string SavedModel (TensorFlow backend); a note of what was (not) written."""
    if args.export == "none":
        return "none (--export none)"
    if keras.backend.backend() != "tensorflow":
        print(f"note: no saved_model/ written: a SavedModel of raw strings needs the TensorFlow backend "
              f"(this run used {keras.backend.backend()}); the trained classifier is in "
              f"{os.path.join(args.output_dir, 'model.keras')}", flush=True)
        return f"none (Keras backend {keras.backend.backend()})"
    import text_serving

    export_dir = os.path.join(args.output_dir, "saved_model")
    text_serving.export(classifier, tokenizer.serving_config(), class_names, export_dir,
                        portable=args.export == "portable")
    return f"{args.export}: {export_dir}"
