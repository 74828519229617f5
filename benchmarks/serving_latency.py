"""Serving latency of the examples' raw-string SavedModels: portable (composite ops, no keras_yoso in the
serving process) vs custom-op exports (C++ kernels; the process must `import keras_yoso` first).

Builds the LRA Text classifier of examples/long_text_classifier.py (its LRA_TEXT settings: bytes, 4,096,
2 blocks, 64 dims, YOSO m = 32, tau = 12; weights as initialized: latency does not depend on them), exports it both
ways with examples/text_serving.py, then serves one review of --review-bytes bytes in a fresh process per
export (the portable one never imports keras_yoso): --repeats calls after 3 warm-ups, median and 90th
percentile in milliseconds. Prints a table, writes serving_latency.json and serving_latency.png.

    python benchmarks/serving_latency.py                 # one 4,096-byte review, 50 calls
    python benchmarks/serving_latency.py --quick         # tiny model and review, for the test suite
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from isolated_run import package_banner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SERVE = r"""
import json, sys, time
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401 (registers the tokenizer ops)
if sys.argv[2] == "custom_op":
    import keras_yoso  # noqa: F401 (registers the custom ops)
path, repeats, review_bytes = sys.argv[1], int(sys.argv[3]), int(sys.argv[4])
words = ("a wonderful film , i loved the music and the story but the end was far too long . " * 400)
review = tf.constant([words[:review_bytes]])
model = tf.saved_model.load(path)
for _ in range(3):
    model.serve(review)
times = []
for _ in range(repeats):
    start = time.perf_counter()
    model.serve(review).numpy()
    times.append(1000 * (time.perf_counter() - start))
print(json.dumps({"median_ms": float(np.median(times)), "p90_ms": float(np.percentile(times, 90)),
                  "keras_yoso_imported": "keras_yoso" in sys.modules}))
"""


def _export(out_dir, quick):
    """The worker (--export-to): builds the classifier and writes both exports and export.json into
    `out_dir`. It runs with examples/ on its PYTHONPATH, as the examples run (their modules import each
    other by name)."""
    import imdb_data
    import long_text_classifier
    import sequence_classification
    import text_serving

    import keras_yoso  # the one the examples import: its custom ops go into the custom_op export
    print(package_banner(os.path.dirname(keras_yoso.__file__), keras_yoso.ops.custom_ops_load_error()), flush=True)
    # The --preset lra model of IMDB bytes, with every other option at the example's own default.
    argv = ["--data-dir", "unused", "--preset", "lra"]
    if quick:
        argv += ["--max-length", "256", "--num-hashes", "4", "--hash-code-len", "8", "--num-layers", "1",
                 "--hidden-dim", "16", "--ffn-dim", "16"]
    args = sequence_classification.parse_args(long_text_classifier.build_parser(), argv, long_text_classifier.LRA_TEXT)
    length = args.max_length
    classifier = sequence_classification.build_classifier(sequence_classification.ByteTokenizer.vocab_size, 2, args)
    paths = {}
    for kind in ("portable", "custom_op"):
        paths[kind] = os.path.join(out_dir, f"saved_model_{kind}")
        text_serving.export(classifier, {"kind": "bytes", "max_length": length},
                            list(imdb_data.IMDB_CLASS_NAMES), paths[kind], portable=kind == "portable")
    with open(os.path.join(out_dir, "export.json"), "w", encoding="utf-8") as f:
        json.dump({"paths": paths, "max_length": length}, f)


def _export_in_a_worker(out_dir, quick):
    """(the two exports' paths by kind, the classifier's max_length), made by this script's --export-to
    worker in a process of its own."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "examples")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    command = [sys.executable, os.path.abspath(__file__), "--export-to", out_dir] + (["--quick"] if quick else [])
    if subprocess.run(command, env=environment).returncode != 0:
        sys.exit("exporting the classifier failed (its output is above)")
    with open(os.path.join(out_dir, "export.json"), encoding="utf-8") as f:
        exported = json.load(f)
    return exported["paths"], exported["max_length"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=".")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--review-bytes", type=int, default=4096)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--export-to", help=argparse.SUPPRESS)  # the worker: export into this folder, then exit
    args = parser.parse_args(argv)
    if args.export_to:
        _export(args.export_to, args.quick)
        return
    if args.quick:
        args.repeats, args.review_bytes = 5, 200
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        paths, length = _export_in_a_worker(scratch, args.quick)
        environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        environment.pop("PYTHONPATH", None)  # the portable process must not find keras_yoso in the source tree
        for kind, path in paths.items():
            process = subprocess.run([sys.executable, "-c", _SERVE, path, kind, str(args.repeats),
                                      str(args.review_bytes)], cwd=scratch, env=environment, capture_output=True,
                                     text=True, timeout=1800)
            if process.returncode != 0:
                sys.exit(f"serving the {kind} export failed:\n{process.stderr[-3000:]}")
            rows.append(dict(export=kind, **json.loads(process.stdout.strip().splitlines()[-1])))
    print(f"one review of {args.review_bytes} bytes, classifier max_length {length}, {args.repeats} calls")
    print(f"{'export':<10} {'keras_yoso imported':>20} {'median ms':>10} {'p90 ms':>8}")
    for row in rows:
        print(f"{row['export']:<10} {str(row['keras_yoso_imported']):>20} {row['median_ms']:>10.1f} {row['p90_ms']:>8.1f}")
    ratio = rows[0]["median_ms"] / rows[1]["median_ms"]
    print(f"portable / custom_op median: {ratio:.2f}x")
    with open(os.path.join(args.out_dir, "serving_latency.json"), "w", encoding="utf-8") as f:
        json.dump({"review_bytes": args.review_bytes, "max_length": length, "repeats": args.repeats, "rows": rows,
                   "portable_over_custom_op": ratio}, f, indent=1)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(5, 3.2))
    axis.bar([row["export"] for row in rows], [row["median_ms"] for row in rows],
             yerr=[[0, 0], [row["p90_ms"] - row["median_ms"] for row in rows]], color=["tab:blue", "tab:orange"])
    axis.set_ylabel("ms per request (median, p90 bar)")
    axis.set_title(f"serving one {args.review_bytes}-byte review")
    figure.tight_layout()
    figure.savefig(os.path.join(args.out_dir, "serving_latency.png"), dpi=120)


if __name__ == "__main__":
    main()
