"""One YosoAttention layer (and optionally the README quick start) on a quiet and on a busy machine.

A busy machine: while the loaded rows run, one competing process per core (--busy) spins a
pure-Python loop; the spinners stop by themselves after --timeout seconds and are killed when the
row is done. Each row times, in fresh processes (benchmarks/attention_scaling.py's, so the same
layer and timing): one YosoAttention layer forward+backward (yoso-32: 4 heads x 64, num_hashes=32,
hash_code_len=8, batch 1, length --length; median of --repeats after a warm-up) and, for the slowdown
to compare with, keras.layers.MultiHeadAttention of the same sizes (unless --no-mha), quiet and loaded,
per backend and per environment variant (--variants: "default" or comma-separated VAR=VALUE
settings, e.g. OMP_WAIT_POLICY=PASSIVE, set before the process starts). With --quick-start it
also times the wall clock of the README quick start, `python examples/long_text_classifier.py`
(--steps N to shorten it). Prints a table, writes busy_machine.json and busy_machine.png.

    python benchmarks/busy_machine.py                          # KERAS_BACKEND, else every backend
    KERAS_BACKEND=torch python benchmarks/busy_machine.py --variants default OMP_WAIT_POLICY=PASSIVE
    python benchmarks/busy_machine.py --backends torch --quick-start --steps 40
    python benchmarks/busy_machine.py --baseline ../before     # and, row by row, the keras_yoso of ../before
    python benchmarks/busy_machine.py --quick                  # tiny sizes, for the test suite

Other processes on the machine make every number noisier: compare rows of one run only.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

from attention_scaling import run_one
from isolated_run import announce_package, failure_status

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SPIN = "import time, sys\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def busy(processes, seconds):
    """`processes` pure-Python spin loops (none when 0), each stopping by itself after `seconds`,
    killed on exit."""
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, str(seconds)]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@contextlib.contextmanager
def environment(variant):
    """os.environ with the VAR=VALUE settings of `variant` ("default": none) while inside."""
    settings = dict(s.split("=", 1) for s in variant.split(",")) if variant != "default" else {}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def layer_seconds(backend, args, method="yoso-32"):
    """{"status", "seconds"}: the median forward+backward of one yoso-32 layer (or of attention_scaling.py's
    `method`), in a fresh process."""
    r = run_one(backend, method, "auto", args.length, args.repeats, args.heads, args.key_dim, 0, args.timeout)
    return {"status": r["status"], "seconds": r.get("seconds"), "implementation": r.get("implementation")}


def mha_seconds(backend, args):
    """layer_seconds of keras.layers.MultiHeadAttention (same sizes): the slowdown YOSO's is held to."""
    return layer_seconds(backend, args, "mha")


@contextlib.contextmanager
def package(tree):
    """The keras_yoso the measurements inside import: the installed one (tree None), or the one in the
    source tree `tree` (its libraries built in place), through PYTHONPATH."""
    with environment("default" if tree is None else f"PYTHONPATH={tree}"):
        yield


def quick_start_seconds(backend, args):
    """{"status", "seconds"}: the wall clock of the README quick start on `backend` (the examples of the
    measured package's tree: this checkout's, or PYTHONPATH's under --baseline)."""
    tree = os.environ.get("PYTHONPATH") or REPO
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, os.path.join(tree, "examples", "long_text_classifier.py"), "--output-dir", out]
        command += ["--steps", str(args.steps)] if args.steps else []
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        start = time.perf_counter()
        try:
            proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"status": f"timeout (> {args.timeout:g} s)", "seconds": None}
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return {"status": failure_status(proc.returncode, proc.stderr), "seconds": None}
    return {"status": "ok", "seconds": seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_backends = [os.environ["KERAS_BACKEND"]] if os.environ.get("KERAS_BACKEND") else ["tensorflow", "jax",
                                                                                               "torch"]
    parser.add_argument("--backends", nargs="+", default=default_backends, choices=("tensorflow", "jax", "torch"),
                        help="Keras backends, each in its own processes (default: KERAS_BACKEND, else all three)")
    parser.add_argument("--variants", nargs="+", default=["default"],
                        help='"default" or comma-separated VAR=VALUE environment settings, one row each')
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--key-dim", type=int, default=64)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1,
                        help="competing spinning processes in the loaded rows (default: one per core)")
    parser.add_argument("--no-mha", action="store_true",
                        help="skip the keras.layers.MultiHeadAttention rows (the slowdown to compare with)")
    parser.add_argument("--quick-start", action="store_true",
                        help="also time the README quick start (python examples/long_text_classifier.py)")
    parser.add_argument("--steps", type=int, default=None, help="--steps of the quick start (default: its own)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds per measurement; the spinners stop by themselves after it")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--baseline", default=None, metavar="TREE",
                        help="also measure the keras_yoso of this source tree (e.g. a git worktree of an earlier "
                             "commit with its libraries built in place), each row beside this package's")
    parser.add_argument("--quick", action="store_true", help="tiny run that checks the script works")
    args = parser.parse_args()
    if args.quick:
        args.length, args.repeats, args.heads, args.key_dim, args.busy, args.timeout = 128, 1, 2, 8, 1, 300.0
        args.quick_start = False
    packages = [("this", None)] + ([("baseline", os.path.abspath(args.baseline))] if args.baseline else [])
    for _, tree in packages:
        with package(tree):
            announce_package(args.backends, expect_custom_ops=True)

    workloads = [("layer fwd+bwd", layer_seconds)] + ([("MHA fwd+bwd", mha_seconds)] if not args.no_mha else [])
    workloads += [("quick start", quick_start_seconds)] if args.quick_start else []
    print(f"{args.busy} busy process(es) in the loaded rows; layer: n = {args.length}, {args.heads} heads x "
          f"{args.key_dim}, m = 32, tau = 8, batch 1")
    header = (f"{'backend':<11} {'package':<9} {'variant':<26} {'workload':<14} {'quiet s':>9} {'loaded s':>9} "
              f"{'loaded/quiet':>13}")
    print(header, flush=True)
    rows = []
    for backend in args.backends:
        for variant in args.variants:
            for workload, measure in workloads:
                for name, tree in packages:
                    row = {"backend": backend, "package": name, "variant": variant, "workload": workload}
                    with package(tree), environment(variant):
                        row["quiet"] = measure(backend, args)
                        with busy(args.busy, args.timeout + 60):
                            row["loaded"] = measure(backend, args)
                    rows.append(row)
                    quiet, loaded = row["quiet"]["seconds"], row["loaded"]["seconds"]
                    ratio = f"{loaded / quiet:.2f}x" if quiet and loaded else "-"
                    cells = [f"{s:.3f}" if s else "-" for s in (quiet, loaded)]
                    failed = [f"{c}: {row[c]['status']}" for c in ("quiet", "loaded") if row[c]["status"] != "ok"]
                    print(f"{backend:<11} {name:<9} {variant:<26} {workload:<14} {cells[0]:>9} {cells[1]:>9} "
                          f"{ratio:>13}  {'; '.join(failed)}", flush=True)

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "busy_machine.json"), "w") as f:
        json.dump({"config": vars(args), "rows": rows}, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 1.2 + 0.5 * len(rows)), squeeze=False)
    for ax, (workload, _) in zip(axes[0], workloads):
        mine = [r for r in rows if r["workload"] == workload]
        labels = [f"{r['backend']} {r['package']} {r['variant']}" for r in mine]
        positions = range(len(mine))
        for offset, condition in ((-0.2, "quiet"), (0.2, "loaded")):
            ax.barh([p + offset for p in positions], [r[condition]["seconds"] or 0.0 for r in mine], height=0.4,
                    label=condition)
        ax.set_yticks(list(positions), labels)
        ax.invert_yaxis()
        ax.set(xlabel="seconds", title=workload)
        ax.legend()
    fig.suptitle(f"Quiet vs {args.busy} busy process(es), YosoAttention n = {args.length}")
    fig.tight_layout()
    path = os.path.join(args.out_dir, "busy_machine.png")
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
