"""The protocol every quality table follows (issue 43, item 2): a table that cannot flatter.

    python benchmarks/quality/protocol.py --task mqar --attention yoso softmax linear --length 32 --pairs 4 \\
        --vocab 256 --steps 250 --batch-size 64 --test-size 256 --lr 3e-3 1e-2 3e-2 \\
        --out docs/data/quality_protocol_2026-11-28.json --machine-note "2 cores shared by 4 agents"

Per attention (and first for the model with no attention, "none", the floor every run must beat):

1. seed 0 at every rate of the grid (--lr, at least GRID_MIN rates);
2. the best rate on the VALIDATION split (`choose`: accuracy, or bits per byte for lm; never the test
   split, which no decision reads); while it is the lowest or highest rate tried, one more rate beyond
   it (that rate divided or multiplied by --extend-factor), at most --max-extensions times; a best rate
   still at the edge after them is recorded as such ("interior": false). While every rate tried failed,
   one more rate beyond each end at once (two extensions, made only while two are left), so that "it
   learned at no rate" rests on rates on both sides of the grid;
3. seeds 1 and 2 at the chosen rate; the table reports the test score's (accuracy's; lm: bits per
   byte's) mean and [min, max] over the seeds that did not fail.

A run fails when its loss is not finite (run.run_one stops it at that step: "diverged") or when its
validation score does not beat the floor's best seed-0 validation score over the floor's grid by
run.floor_margin ("learned_nothing", run.judge). A failed run is recorded with its reason, is never a
candidate rate and is never averaged into a mean; report.py names it in the table.

Every run is one record (run.run_one's, plus "status", "failure", "floor" and "protocol": phase, grid,
extension factor and limit, and whether the machine was quiet) appended to --out, a JSON list; a run
already in --out (same experiment, attention, settings, rate and seed) is reused, not trained again, so
an interrupted protocol resumes and attentions can be added by later invocations. `summarize` derives an
attention's row from its records alone; report.py renders docs/quality.md's protocol tables with it.

The data and model options are run.py's (only tasks with a validation split: run.VALIDATION_TASKS).
"""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import plot  # noqa: E402  (no Keras: each task's score, plot.metric)
if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")

GRID_MIN = 3  # rates of the first grid
SEEDS = (0, 1, 2)  # seed 0 chooses the rate; all three are reported at it
EXTEND_FACTOR = 3.0
MAX_EXTENSIONS = 2
FAILED = ("diverged", "learned_nothing")


def failed(record):
    return record["status"] in FAILED


def extended_rate(lr, factor, direction):
    """`lr` multiplied (direction +1) or divided (-1) by `factor`, to 3 significant digits."""
    return float(f"{lr * factor ** direction:.3g}")


def choose(seed0_runs):
    """(chosen rate, edge) from one attention's seed-0 runs (records with "task", "lr", "status" and the
    validation score, plot.metric): the rate of the best validation score (highest accuracy; lowest bits
    per byte for lm) among the runs that did not fail (None when all failed); edge is -1 when it is the lowest rate tried (failed runs count as tried),
    +1 when the highest, 0 when interior (and when no rate was chosen). The test split is never read."""
    kept = [r for r in seed0_runs if not failed(r)]
    if not kept:
        return None, 0
    best = max(kept, key=lambda r: (plot.score(r, "validation"), -r["lr"]))["lr"]
    tried = sorted({r["lr"] for r in seed0_runs})
    return best, -1 if best == tried[0] else (1 if best == tried[-1] else 0)


def run_protocol(train, grid, extend_factor=EXTEND_FACTOR, max_extensions=MAX_EXTENSIONS, seeds=SEEDS):
    """Runs the protocol for one attention; its records in the order trained.

    Args:
        train: train(lr, seed, phase) -> record (with "lr", "seed", "status", "validation_accuracy"),
            phase "grid", "extension" or "seeds".
        grid: at least GRID_MIN distinct positive rates.
        extend_factor: > 1; the ratio of an extension to the edge rate it extends.
        max_extensions: >= 0; extensions at most.
        seeds: the first chooses the rate; every seed runs at the chosen one.
    """
    grid = sorted(set(grid))
    if len(grid) < GRID_MIN or grid[0] <= 0:
        raise ValueError(f"protocol: the learning-rate grid needs at least {GRID_MIN} distinct positive rates, "
                         f"got {grid}")
    if not extend_factor > 1:
        raise ValueError(f"protocol: extend_factor must be > 1, got {extend_factor}")
    if max_extensions < 0:
        raise ValueError(f"protocol: max_extensions must be >= 0, got {max_extensions}")
    first, *others = seeds
    records = [train(lr, first, "grid") for lr in grid]
    extensions = 0
    while extensions < max_extensions:
        best, edge = choose(records)
        if best is None:  # every rate failed: both ends at once, or none
            if max_extensions - extensions < 2:
                break
            tried = sorted({r["lr"] for r in records})
            records += [train(extended_rate(tried[0], extend_factor, -1), first, "extension"),
                        train(extended_rate(tried[-1], extend_factor, 1), first, "extension")]
            extensions += 2
            continue
        if edge == 0:
            break
        records.append(train(extended_rate(best, extend_factor, edge), first, "extension"))
        extensions += 1
    best, _ = choose(records)
    if best is not None:
        records += [train(best, seed, "seeds") for seed in others]
    return records


def summarize(records):
    """One attention's protocol row from its records (one configuration; any order): the score's name
    ("metric", plot.metric) and whether higher is better, chosen rate, whether it is interior, the
    validation score per rate (seed 0; None for a failed run), the test score's mean, min and max over the
    seeds at the chosen rate that did not fail, the seeds kept and run there, the
    failed runs, and whether the protocol ran to its end ("complete": False when it was stopped before,
    e.g. at a deadline: then the row is what ran, not the protocol's result)."""
    test_field, validation_field, name, higher = plot.metric(records[0]["task"])
    seed0 = [r for r in records if r["seed"] == SEEDS[0]]
    chosen, edge = choose(seed0)
    at_chosen = [r for r in records if r["lr"] == chosen]
    kept = [r[test_field] for r in at_chosen if not failed(r)]
    protocol = records[0].get("protocol", {})
    extensions = sum(1 for r in seed0 if r.get("protocol", {}).get("phase") == "extension")
    grid_done = len({r["lr"] for r in seed0 if r.get("protocol", {}).get("phase", "grid") == "grid"}) >= GRID_MIN
    left = protocol.get("max_extensions", extensions) - extensions
    # As run_protocol stops: with a rate chosen, at an interior best or with no extension left; with every rate
    # failed, with fewer than two left and no pair of ends half tried (it tries both ends at once).
    extended = ((chosen is not None and (edge == 0 or left < 1))
                or (chosen is None and left < 2 and extensions % 2 == 0))
    complete = grid_done and extended and (chosen is None or len(at_chosen) == len(SEEDS))
    return {
        "metric": name, "higher_is_better": higher, "chosen_lr": chosen, "interior": chosen is not None and edge == 0, "edge": edge, "extensions": extensions,
        "max_extensions": protocol.get("max_extensions"), "complete": complete,
        "validation": {r["lr"]: (None if failed(r) else r[validation_field]) for r in seed0},
        "test_mean": statistics.mean(kept) if kept else None, "test_min": min(kept) if kept else None,
        "test_max": max(kept) if kept else None, "seeds_kept": len(kept), "seeds_run": len(at_chosen),
        "failed": sorted((r for r in records if failed(r)), key=lambda r: (r["lr"], r["seed"])),
    }


def failed_run(record):
    """A failed run, named for a table: "lr 0.03 seed 0 diverged (step 53)" or "... learned nothing"."""
    what = ("diverged" + (f" (step {record['diverged']['step']})" if record.get("diverged") else "")
            if record["status"] == "diverged" else "learned nothing")
    return f"lr {record['lr']:g} seed {record['seed']} {what}"


def seed0_cell(run):
    """A table's cell for a seed-0 run: its validation score (plot.metric); a failed run says so before it
    ("failed (0.503)"; "failed (diverged)": a diverged run has no score)."""
    if run["status"] == "diverged":
        return "failed (diverged)"
    score = f"{run[plot.metric(run['task'])[1]]:.3f}"
    return f"failed ({score})" if failed(run) else score


def outcome(row):
    """(chosen rate, interior, result) cells of a table row from `summarize`'s row: "none", "—" and "every
    rate failed" when no rate was chosen; a result "mean [min, max] (seeds kept of run)"; and, while the
    protocol has not run to its end, interior "—" and "protocol stopped before its end: " before the result,
    so that a table of what ran so far never reads as the protocol's result."""
    if row["chosen_lr"] is None:
        chosen, interior, result = "none", "—", "every rate failed"
    else:
        chosen = f"{row['chosen_lr']:g}"
        interior = "yes" if row["interior"] else f"no: at the edge after {row['extensions']} extension(s)"
        result = (f"{row['test_mean']:.3f} [{row['test_min']:.3f}, {row['test_max']:.3f}] "
                  f"({row['seeds_kept']} of {row['seeds_run']})" if row["seeds_kept"] else
                  f"every seed failed (0 of {row['seeds_run']})")
    if not row["complete"]:
        interior, result = "—", f"protocol stopped before its end: {result}"
    return chosen, interior, result


# ----------------------------------------------------------------------------- the driver

def _matches(record, args, name, kwargs, lr, seed):
    import run

    def given(settings):  # a keyword argument at None is one a record may predate (feature_dim)
        return {k: v for k, v in (settings or {}).items() if v is not None}

    return (record.get("attention") == name and given(record.get("attention_kwargs")) == given(kwargs)
            and all(record.get(k) == v for k, v in run.cell_fields(args, lr, seed).items())
            and record.get("validation_size") == args.validation_size)


def _strongest_floor(records):
    """The floor's seed-0 run with the best validation score: the one every run must beat."""
    return max((r for r in records if r["seed"] == SEEDS[0]), key=lambda r: plot.score(r, "validation"))


def build_parser():
    import run

    parser = run.build_parser()
    parser.description = __doc__
    group = parser.add_argument_group("protocol")
    group.add_argument("--extend-factor", type=float, default=EXTEND_FACTOR,
                       help="ratio of an extension to the edge rate it extends. Default: %(default)s")
    group.add_argument("--max-extensions", type=int, default=MAX_EXTENSIONS,
                       help="extensions of the grid at most, per attention. Default: %(default)s")
    group.add_argument("--machine-note", required=True,
                       help="what else ran on the machine, recorded with every run ('quiet' if nothing)")
    return parser


def main(argv=None):
    import run

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)  # the protocol's options; run.parse_args checks and completes the rest
    _, run_args = run.parse_args(_run_argv(argv))
    if not run.has_validation(run_args):
        parser.error(f"the protocol chooses on a validation split: --task {args.task} has none "
                     f"(run.VALIDATION_TASKS: {run.VALIDATION_TASKS}) or --validation-size is 0")
    if len(set(run_args.lr)) < GRID_MIN:
        parser.error(f"--lr: the protocol needs at least {GRID_MIN} distinct rates, got {run_args.lr}")
    if args.out is None or not args.out.endswith(".json"):
        parser.error(f"--out: the protocol appends its records to a .json file, got {args.out!r}")
    if args.seeds != [SEEDS[0]]:
        parser.error(f"--seeds: the protocol runs seeds {list(SEEDS)} itself, got {args.seeds}")
    kwargs = run.kwargs_per_attention(parser, run_args)
    kwargs.setdefault("none", {})
    command = ["benchmarks/quality/protocol.py"] + argv
    existing = run.plot.load([args.out]) if os.path.exists(args.out) else []
    quiet = args.machine_note.strip().lower() == "quiet"
    meta = {"grid": sorted(set(run_args.lr)), "extend_factor": args.extend_factor,
            "max_extensions": args.max_extensions, "machine_quiet": quiet, "machine_note": args.machine_note}

    def trainer(name, floor):
        label = run.label_of(run_args, name, kwargs[name]) if name != "none" else "none"

        def train(lr, seed, phase):
            for record in existing:
                if _matches(record, run_args, name, kwargs[name], lr, seed):
                    print(f"[{label} lr={lr:g} seed={seed}] reusing the record of {record['date']} in {args.out}",
                          flush=True)
                    return record
            record = run.run_one(run_args, name, kwargs[name], lr, seed, label, command)
            if floor is None:
                record["status"], record["failure"] = "floor", None
            else:
                record["status"], record["failure"] = run.judge(
                    record, floor, split="validation",
                    floor_is=f"its best seed-0 validation {plot.metric(floor['task'])[2]}, lr {floor['lr']:g}")
            record["floor"] = None if floor is None else {k: floor[k] for k in ("lr", "seed", *plot.metric(
                floor["task"])[:2], "date")}
            record["protocol"] = {**meta, "phase": phase}
            run.append_results(args.out, [record])
            existing.append(record)
            test_field, validation_field, metric, _ = plot.metric(record["task"])
            print(f"[{label} lr={lr:g} seed={seed}] {phase}: validation {metric} {record[validation_field]:.4f}, "
                  f"test {record[test_field]:.4f}, {record['status']}"
                  + (f": {record['failure']}" if record["failure"] else ""), flush=True)
            return record

        return train

    floor_records = run_protocol(trainer("none", None), run_args.lr, args.extend_factor, args.max_extensions)
    floor = _strongest_floor(floor_records)
    rows = {"none": summarize(floor_records)}
    for name in run_args.attention:
        if name != "none":
            rows[name] = summarize(run_protocol(trainer(name, floor), run_args.lr, args.extend_factor,
                                                args.max_extensions))
    for name, row in rows.items():
        where = "interior" if row["interior"] else f"at the edge after {row['extensions']} extension(s)"
        result = ("every rate failed" if row["chosen_lr"] is None else
                  f"lr {row['chosen_lr']:g} ({where}): test {row['metric']} {row['test_mean']:.4f} [{row['test_min']:.4f}, "
                  f"{row['test_max']:.4f}] over {row['seeds_kept']} of {row['seeds_run']} seeds"
                  if row["seeds_kept"] else f"lr {row['chosen_lr']:g}: every seed failed")
        print(f"{name}: {result}; {len(row['failed'])} failed run(s)", flush=True)
    return rows


def _run_argv(argv):
    """`argv` without the protocol's own options (run.parse_args does not take them)."""
    own = {"--extend-factor", "--max-extensions", "--machine-note"}
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in own:
            skip = True
            continue
        if arg.split("=", 1)[0] in own:
            continue
        out.append(arg)
    return out


if __name__ == "__main__":
    main()
