"""`train_and_export`: `model.fit` in intervals of --eval-every steps, with validation after each
and checkpoints, resuming from --checkpoint-dir; the outputs once --steps are done (outputs.py)."""

import os
import sys
import time

import keras

import keras_yoso

from .batches import split_batches
from .checkpoint import Checkpoint, data_digest, run_fingerprint
from .device_mesh import describe_mesh, mesh_distribution
from .evaluation import evaluate
from .model import build_classifier
from .optimizer import DenseGradientAdam, LinearWarmupLinearDecay
from .outputs import RunResult, finish_run
from .progress import IntervalMetrics, ProgressLines, process_cpu_seconds, progress_every


def train_and_export(task, args, tokenizer, class_names, train, validation, test, build=None):
    """Trains (resuming from --checkpoint-dir), evaluates on `test` once --steps are done, writes the
    outputs to `args.output_dir`; a RunResult (finished=False when --stop-after-steps stopped it).

    With --mesh, all of it (building or loading the model, training, evaluation, saving) runs
    under its `keras_yoso.distribution.SequenceParallel` (`mesh_distribution`); the returned
    classifier's variables stay on the mesh's devices (call it under that distribution, or load
    model.keras, which any process can use without one). `build`: a function returning the uncompiled
    classifier (token ids `[batch, length]` -> class probabilities); default: model.build_classifier."""
    distribution = mesh_distribution(args)
    if distribution is None:
        return _train_and_export(task, args, tokenizer, class_names, train, validation, test, build)
    with distribution.scope():
        return _train_and_export(task, args, tokenizer, class_names, train, validation, test, build)


def _train_and_export(task, args, tokenizer, class_names, train, validation, test, build):
    keras.utils.set_random_seed(args.seed)
    os.makedirs(args.output_dir, exist_ok=True)
    encoded = {name: tokenizer.encode(split.texts) for name, split in
               (("train", train), ("validation", validation), ("test", test))}
    probe = split_batches(args, encoded["train"], train, seed=args.seed)
    args.steps = args.steps or probe.batches_per_pass * args.epochs
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else round(args.warmup_fraction * args.steps)
    args.eval_every = args.eval_every or max(1, -(-args.steps // 10))
    checkpoint = Checkpoint(args.checkpoint_dir, run_fingerprint(args, task, data_digest(train, validation, test)))

    classifier, state = checkpoint.load()
    if classifier is None:
        classifier = build() if build else build_classifier(tokenizer.vocab_size, len(class_names), args)
        schedule = LinearWarmupLinearDecay(args.learning_rate, args.warmup_steps, args.steps)
        classifier.compile(optimizer=DenseGradientAdam(schedule), loss="sparse_categorical_crossentropy",
                           metrics=["accuracy"], jit_compile="auto")
        state = {"step": 0, "train_seconds": 0.0, "train_cpu_seconds": 0.0, "invocations": 0,
                 "history": {key: [] for key in ("step", "train_loss", "train_accuracy", "val_loss", "val_accuracy")}}
    state["invocations"] += 1
    validation_batches = split_batches(args, encoded["validation"], validation)
    stop = args.steps if args.stop_after_steps is None else min(args.steps, state["step"] + args.stop_after_steps)
    print(f"{task}: {len(train)} train / {len(validation)} validation / {len(test)} test examples; "
          f"attention={args.attention}, {classifier.count_params():,} parameters, Keras backend "
          f"{keras.backend.backend()}, YOSO ops: {keras_yoso.ops.implementation_in_use()}; "
          f"steps {state['step']} -> {stop} of {args.steps} (batch {args.batch_size}, "
          f"{probe.batches_per_pass} per pass over the training split)", flush=True)
    if getattr(args, "mesh", None):
        describe_mesh(args, probe, len(train))

    while state["step"] < stop:
        until = min(stop, (state["step"] // args.eval_every + 1) * args.eval_every)
        batches = split_batches(args, encoded["train"], train, seed=args.seed, first_step=state["step"],
                                num_steps=until - state["step"])
        interval = IntervalMetrics()
        start, start_cpu = time.perf_counter(), process_cpu_seconds()
        # shuffle=False: Keras would reorder the PyDataset batches with Python's random; Batches orders them.
        interactive = sys.stdout.isatty()
        callbacks = [interval]
        if not interactive:
            callbacks.append(ProgressLines(state["step"], args.steps, progress_every(args)))
        classifier.fit(batches.keras_input(), epochs=1, shuffle=False, callbacks=callbacks,
                       verbose=1 if interactive else 0)
        state["train_seconds"] += time.perf_counter() - start
        state["train_cpu_seconds"] += process_cpu_seconds() - start_cpu
        state["step"] = until
        if until % args.eval_every == 0 or until == args.steps:
            print(f"step {until}/{args.steps}: evaluating on {len(validation)} validation examples", flush=True)
            val_loss, val_accuracy = evaluate(classifier, validation_batches)
            means = interval.means()
            for key, value in (("step", until), ("train_loss", means["loss"]), ("train_accuracy", means["accuracy"]),
                               ("val_loss", val_loss), ("val_accuracy", val_accuracy)):
                state["history"][key].append(float(value))
            print(f"step {until}/{args.steps}: validation accuracy {val_accuracy:.4f}, loss {val_loss:.4f}", flush=True)
            checkpoint.save(classifier, state)
    if state["step"] < args.steps:
        checkpoint.save(classifier, state)
        print(f"stopped after step {state['step']} of {args.steps}; checkpoint in {args.checkpoint_dir}. Run the same "
              "command again to continue.", flush=True)
        return RunResult({}, classifier, args.output_dir, finished=False)
    checkpoint.save(classifier, state)
    return finish_run(task, args, tokenizer, class_names, classifier, state, encoded, train, validation, test)
