"""Builds of the native library side by side: each CPU kernel's time per call, in one process.

    python benchmarks/native_ab.py --libraries before/_yoso_native.so after/_yoso_native.so \\
        --labels before after --record docs/data/native_ab_2026-11-30.json --machine-note quiet

For kernel work on the CPU. Every library loads into this one process (ctypes: each keeps its own
symbols, thread pool and scratch) and runs, through the C ABI's ky_run, the same primitive calls on
the same inputs: the eq. 4 lower bound (`lower_bound_gradients`), the causal weighted cumulation
(`weighted_lsh_cumulation`, causal = 1: each half of the causal eq. 4) and the forward
(`lsh_cumulation`), at each --hash-code-lens tau. The libraries take turns, --rounds times; each turn
times --repeats calls of one (primitive, tau) and keeps the fastest, and the table gives each
library's fastest over the rounds (on a loaded machine the minimum moves least), its ratio to the
first library's and whether its outputs are bitwise equal to the first's.

Inputs: B x H = --batch rows of --length queries and keys of --dim features (values of --dim too),
--num-hashes hashes; the codes are uniform over the 2**tau buckets (about length / 2**tau keys a
bucket, which decides between the kernels' pair and table forms), every mask one.

Prints the table, writes native_ab.png in --out-dir, and with --record appends one record (the
command, the machine, the libraries' build info, every case) to that JSON list. `--render RECORDS`
measures nothing: it prints the heading and table of every record in RECORDS (docs/benchmarks.md
quotes them; a test compares) and draws record i's figure as native_ab_<i>.png in --out-dir.
"""

import argparse
import datetime
import os
import sys
import textwrap
import time

import numpy as np

import conversion_error  # beside this script: its append_record(), add_record_arguments()
import decoding  # beside this script: its machine()

CASES = (  # (name in the table, primitive, causal)
    ("eq. 4 (lower_bound_gradients)", "lower_bound_gradients", 0),
    ("causal weighted cumulation", "weighted_lsh_cumulation", 1),
    ("forward (lsh_cumulation)", "lsh_cumulation", 0),
)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--libraries", nargs="+",
                        help="paths of native library builds (_yoso_native*.so); the first is the baseline")
    parser.add_argument("--labels", nargs="+", default=None, help="one per library. Default: the paths")
    parser.add_argument("--hash-code-lens", type=int, nargs="+", default=[2, 4, 6, 8, 9],
                        help="tau of each case. Default: %(default)s")
    parser.add_argument("--batch", type=int, default=32, help="B x H. Default: %(default)s")
    parser.add_argument("--length", type=int, default=512, help="queries and keys. Default: %(default)s")
    parser.add_argument("--dim", type=int, default=32, help="features of q, k and v. Default: %(default)s")
    parser.add_argument("--num-hashes", type=int, default=32, help="Default: %(default)s")
    parser.add_argument("--threads", type=int, default=1, help="the kernels' threads. Default: %(default)s")
    parser.add_argument("--rounds", type=int, default=4, help="turns of each library. Default: %(default)s")
    parser.add_argument("--repeats", type=int, default=8, help="calls timed per turn. Default: %(default)s")
    conversion_error.add_record_arguments(parser, os.path.join("runs", "native_ab"))
    args = parser.parse_args(argv)
    if args.render:
        return args
    args.libraries = args.libraries or []
    args.labels = args.labels or args.libraries
    if len(args.libraries) < 2:
        parser.error(f"--libraries: expected at least 2 paths (a baseline and a candidate), got {len(args.libraries)}")
    if len(args.labels) != len(args.libraries):
        parser.error(f"--labels: expected one per library ({len(args.libraries)}), got {len(args.labels)}")
    for tau in args.hash_code_lens:
        if not 1 <= tau <= 20:
            parser.error(f"--hash-code-lens: expected values in [1, 20], got {tau}")
    for name in ("batch", "length", "dim", "num_hashes", "threads", "rounds", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    return args


def case_arrays(args, tau, seed=0):
    """(inputs, attributes, outputs) per case name: numpy arrays in each primitive's table order."""
    rng = np.random.default_rng(seed)
    shape = (args.batch, args.length, args.dim)
    q, k, v, dy = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    mask = np.ones((args.batch, args.length), np.float32)
    qc, kc = (rng.integers(0, 2 ** tau, (args.batch, args.num_hashes, args.length)).astype(np.int32) for _ in "qk")
    buckets = 2 ** tau
    return {
        "lower_bound_gradients": ([mask, qc, q, mask, kc, k, v, dy], [buckets, 0],
                                  [np.empty_like(q), np.empty_like(k)]),
        "weighted_lsh_cumulation": ([mask, qc, dy, mask, kc, v, k], [buckets, 1], [np.empty_like(q)]),
        "lsh_cumulation": ([mask, qc, mask, kc, v], [buckets, 0], [np.empty_like(v)]),
    }


def _native_library():
    """keras_yoso's binding of the C ABI, imported when a measurement starts: importing keras_yoso starts Keras and
    its backend (10-15 s on 2 cores), which --render and a refused argument need not wait for."""
    from keras_yoso.ops.providers import native_library

    return native_library


def _view(array):
    return _native_library().tensor_view(array.ctypes.data, str(array.dtype), array.shape)


def fastest_ms(native, primitive, arrays, threads, repeats):
    """The fastest of `repeats` calls of `primitive` on `arrays` through library `native`, in ms."""
    inputs, attributes, outputs = arrays
    views = [_view(a) for a in inputs], [_view(a) for a in outputs]
    call = _native_library().call  # looked up once, outside the timed calls
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call(primitive, views[0], attributes, views[1], num_threads=threads, native=native)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def measure(args, natives):
    """One row per (case, tau): each library's fastest ms over the rounds and whether its outputs equal the
    first library's bitwise."""
    rows = []
    for tau in args.hash_code_lens:
        per_library = [case_arrays(args, tau) for _ in natives]  # each library writes its own outputs
        for name, primitive, _ in CASES:
            best = [float("inf")] * len(natives)
            for _ in range(args.rounds):
                for i, native in enumerate(natives):
                    best[i] = min(best[i], fastest_ms(native, primitive, per_library[i][primitive], args.threads,
                                                      args.repeats))
            first = per_library[0][primitive][2]
            equal = [all(np.array_equal(a, b) for a, b in zip(first, arrays[primitive][2])) for arrays in per_library]
            rows.append({"case": name, "primitive": primitive, "tau": tau, "ms": best,
                         "ratio_to_first": [b / best[0] for b in best], "bitwise_equal_to_first": equal})
    return rows


def table(rows, labels):
    head = ["case", "tau"] + [f"{label} ms" for label in labels] + [f"{label} / {labels[0]}" for label in labels[1:]]
    lines = ["| " + " | ".join(head) + " |", "| --- | ---: |" + " ---: |" * (len(head) - 2)]
    for row in rows:
        cells = [row["case"], str(row["tau"])] + [f"{ms:.1f}" for ms in row["ms"]]
        cells += [f"{ratio:.2f}" + ("" if equal else " (outputs differ)")
                  for ratio, equal in zip(row["ratio_to_first"][1:], row["bitwise_equal_to_first"][1:])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows, labels, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name, _, _ in CASES]
    figure, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for axis, name in zip(axes[0], names):
        mine = [r for r in rows if r["case"] == name]
        x = np.arange(len(mine))
        width = 0.8 / len(labels)
        for i, label in enumerate(labels):
            axis.bar(x + (i - (len(labels) - 1) / 2) * width, [r["ms"][i] for r in mine], width, label=label)
        axis.set_xticks(x, [f"tau {r['tau']}" for r in mine])
        axis.set_title(name, fontsize=9)
        axis.set_ylabel("ms per call (fastest)")
    axes[0][0].legend(fontsize=8)
    figure.suptitle(textwrap.fill(title, 150), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def cpu():
    """The CPU model and cores (decoding.machine) and the widest vector extension /proc/cpuinfo lists."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2 listed"
    return f"{decoding.machine()}, {vectors}"


def heading(shapes, machine):
    """The line above the table: the shapes and timing of the run (a record's "shapes") and its machine."""
    return (f"B*H = {shapes['batch']}, n = {shapes['length']}, d = {shapes['dim']}, m = {shapes['num_hashes']}, "
            f"{shapes['threads']} thread(s), fastest of {shapes['rounds']} x {shapes['repeats']} calls; "
            f"machine: {machine['cpu']}, {machine['note']}")


def _labels(record):
    return [library["label"] for library in record["libraries"]]


def render(records):
    """The heading and table of each of `records`, as main printed them, a blank line between."""
    return "\n\n".join(heading(r["shapes"], r["machine"]) + "\n" + table(r["rows"], _labels(r)) for r in records)


def draw(records, out_dir):
    """Record i of `records` as out_dir/native_ab_<i>.png, as main drew it; the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f"native_ab_{i}.png") for i in range(len(records))]
    for record, figure in zip(records, paths):
        plot(record["rows"], _labels(record), figure,
             f"{' vs '.join(_labels(record))}: {heading(record['shapes'], record['machine'])}")
    return paths


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render:
        return conversion_error.show_records(args.render, render, draw, args.out_dir)
    natives = [_native_library().open_library(os.path.abspath(path)) for path in args.libraries]
    load_before = os.getloadavg()
    rows = measure(args, natives)
    shapes = {"batch": args.batch, "length": args.length, "dim": args.dim, "num_hashes": args.num_hashes,
              "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats}
    machine = {"cpu": cpu(), "note": args.machine_note}
    print(heading(shapes, machine))
    print(table(rows, args.labels))
    os.makedirs(args.out_dir, exist_ok=True)
    figure = os.path.join(args.out_dir, "native_ab.png")
    plot(rows, args.labels, figure, f"{' vs '.join(args.labels)}: {heading(shapes, machine)}")
    print(f"wrote {figure}")
    if args.record:
        record = {"command": " ".join([os.path.basename(sys.executable), *(sys.argv if argv is None else
                                                                            ["benchmarks/native_ab.py", *argv])]),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "machine": dict(machine, quiet=args.machine_note.startswith("quiet"),
                                  load_average_before_after=[list(load_before), list(os.getloadavg())]),
                  "libraries": [{"label": label, "path": path, "build": native.ky_build_info().decode()}
                                for label, path, native in zip(args.labels, args.libraries, natives)],
                  "shapes": shapes, "rows": rows}
        conversion_error.append_record(args.record, record)
        print(f"appended the record to {args.record}")


if __name__ == "__main__":
    main()
