"""Recall at the lengths YOSO is for, on a GPU (issue 43, item 7): the MQAR cell (512, 64) at widths 64
and 128, and MQAR at 2,048-8,192 tokens with its 64 pairs, YOSO against softmax
(on a GPU, Keras's flash attention where the backend has it) and the baselines, the same model and
budget for every attention of a stage. Prepared for a GPU machine lent for minutes (JAX with CUDA, no
TensorFlow, no network, keras_yoso's native library with its GPU kernels carried along).

    KERAS_BACKEND=jax python3 benchmarks/quality/gpu_scale.py --out DIR --deadline 400
    python benchmarks/quality/gpu_scale.py --dry-run --out DIR     # every stage's plan checked, the first
                                                                    # of YOSO against softmax trained at a
                                                                    # tiny size (CPU; CI)
    python benchmarks/quality/gpu_scale.py --render docs/data/quality_gpu_scale_2026-11-29.json
                                                                    # a saved run's table, as docs/quality.md
                                                                    # quotes it

Each stage trains its attentions through run.py (one process per stage, killed when the deadline comes:
run.py appends every finished run's record to DIR/<stage>/results.json as it goes, so a cut stage keeps
what it finished), after the model with no attention (run.py's floor: a run that does not beat it is
recorded as failed, never as an accuracy). Stages run most valuable first; one is skipped, and says so,
when less time is left than its estimate (`Stage.estimate_s`, the H200 estimate, or, once a stage has run,
its measured seconds per trained token times the stage's tokens). DIR/<stage>.json holds the stage's
plan, status, wall time and records before the next stage starts; DIR/summary.json and the table printed
last gather them.

What it is and is not: one learning rate (--lr, the rate the CPU cells chose most often) and one seed by
default, so a screening of where YOSO's recall stands at these sizes, not a protocol table (no rate grid,
no validation selection, no 3 seeds: docs/quality.md's protocol tables are those). Append its records to
docs/data/ with the machine and the date, and say so where they are quoted.
"""

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

if __name__ == "__main__":  # as run.py: JAX unless told otherwise (the GPU machine has no TensorFlow)
    os.environ.setdefault("KERAS_BACKEND", "jax")

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run.py")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One cell: the MQAR length and pairs, the model width, the budget (steps of batch_size) and the
    attentions trained on it; estimate_s: its expected seconds on an H200 (floor included)."""
    name: str
    length: int
    pairs: int
    width: int
    steps: int
    batch_size: int
    attentions: tuple
    estimate_s: float
    attention_kwargs: str = ""  # run.py's --attention-kwargs (JSON), "" for the attentions' defaults

    @property
    def tokens(self):
        """Tokens trained per run: what the measured time per token scales with."""
        return self.steps * self.batch_size * self.length


BASELINES = ("linear", "gated_deltanet", "performer", "linear_relative")  # linear_relative: Scaleformer
# In the order of what is still unmeasured. 2026-11-29 on an H200 (docs/data/quality_gpu_scale_2026-11-29.json):
# (512, 64) at width 64 took 192 s with the floor, YOSO 0.998 and softmax 1.000; at 2,048 and 4,096 tokens every
# model, softmax included, learned nothing in 1,000 steps of 32,768 tokens. 2026-11-30
# (docs/data/quality_gpu_scale_2026-11-30.json): the baselines' stage stopped at gated_deltanet (no keras-hub on
# the GPU machine; such an attention is now left out, and said so, before the stage starts) after linear learned
# nothing; (2,048, 128) learned nothing in 3,000 steps, softmax included, so the 2,048-token stage keeps the 64
# pairs of the cell every model learns at 512 and changes only the length (4,096 and 8,192 too); width 128 was
# cut after YOSO's 1,500 steps (training accuracy 0.9999) before its evaluation, and runs first now, as it is the
# cheapest.
STAGES = (
    Stage("mqar_512_64_width128", 512, 64, 128, 1500, 64, ("yoso", "softmax"), 200),
    Stage("mqar_512_64_baselines", 512, 64, 64, 1500, 64, BASELINES, 330),
    Stage("mqar_2048_64", 2048, 64, 64, 3000, 16, ("yoso", "softmax"), 270),
    # issue 43 item 5: the sweep's best settings at (64, 8) but the default (m 32, tau 6, in the width-64 stage)
    # at the (512, 64) cell (docs/quality.md section 7)
    Stage("mqar_512_64_m64_tau6", 512, 64, 64, 1500, 64, ("yoso",), 170, '{"num_hashes": 64, "hash_code_len": 6}'),
    Stage("mqar_512_64_m32_tau5", 512, 64, 64, 1500, 64, ("yoso",), 140, '{"num_hashes": 32, "hash_code_len": 5}'),
    Stage("mqar_4096_64", 4096, 64, 64, 3000, 8, ("yoso", "softmax"), 270),
    Stage("mqar_8192_64", 8192, 64, 64, 3000, 4, ("yoso", "softmax"), 270),
    Stage("mqar_512_64_width64", 512, 64, 64, 1500, 64, ("yoso", "softmax"), 200),
)
# The dry run's sizes: every stage's attentions, at a size a CPU trains in seconds.
DRY = dict(length=24, pairs=4, width=16, steps=2, batch_size=4)


def stage_argv(stage, args, out_dir, dry_run=False):
    """run.py's command line for `stage` (`dry_run`: at DRY's sizes)."""
    size = DRY if dry_run else dict(length=stage.length, pairs=stage.pairs, width=stage.width, steps=stage.steps,
                                    batch_size=stage.batch_size)
    argv = ["--task", "mqar", "--attention", *stage.attentions, "--length", str(size["length"]),
            "--pairs", str(size["pairs"]), "--width", str(size["width"]), "--steps", str(size["steps"]),
            "--batch-size", str(size["batch_size"]), "--lr", str(args.lr), "--seeds", *map(str, args.seeds),
            "--out", out_dir]
    if stage.attention_kwargs:
        argv += ["--attention-kwargs", stage.attention_kwargs]
    if dry_run:
        argv += ["--test-size", "8", "--layers", "1", "--heads", "1", "--vocab", "64"]
    return argv


def check_plans(args):
    """Every stage's command line through run.py's own argument checks (attention names included), in
    this process: a typo fails here, on a CPU, not on the GPU machine."""
    spec = importlib.util.spec_from_file_location("quality_run", RUN)  # by path: sys.path untouched here
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    for stage in STAGES:
        parser, parsed = run.parse_args(stage_argv(stage, args, os.path.join(args.out, stage.name)))
        run.kwargs_per_attention(parser, parsed)


def environment():
    """The machine: the accelerator JAX sees, the versions, whether keras_yoso's GPU kernels load."""
    probe = ("import json, keras, keras_yoso; from keras_yoso import ops; "
             "info = {'keras': keras.__version__, 'keras_yoso': keras_yoso.__version__, "
             "'backend': keras.backend.backend(), 'yoso_ops': ops.implementation_in_use()}\n"
             f"import sys; sys.path.insert(0, {HERE!r}); import attentions\n"
             "info['unavailable'] = attentions.unavailable()\n"
             "if info['backend'] == 'jax':\n"
             "    import jax; info.update(jax=jax.__version__, devices=[str(d) for d in jax.devices()], "
             "platform=jax.default_backend())\n"
             "print(json.dumps(info))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    info = {"python": platform.python_version(), "host": platform.node(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        info.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        info["probe_error"] = (proc.stdout + proc.stderr)[-2000:]
    return info


def write_json(path, payload):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def read_records(out_dir):
    path = os.path.join(out_dir, "results.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def run_stage(stage, args, remaining_s, dry_run=False, unavailable=None):
    """Trains `stage` in a run.py process limited to `remaining_s`; its report (status, seconds, records, and
    not_run: {attention: why} for those of `unavailable`, {name: why}, which it leaves out)."""
    out_dir = os.path.join(args.out, stage.name)
    os.makedirs(out_dir, exist_ok=True)
    not_run = {name: why for name, why in (unavailable or {}).items() if name in stage.attentions}
    kept = tuple(name for name in stage.attentions if name not in not_run)
    if not kept:
        return {"stage": dataclasses.asdict(stage), "status": "skipped: no attention can run here", "seconds": 0.0,
                "records": [], "not_run": not_run}
    argv = [sys.executable, RUN, *stage_argv(dataclasses.replace(stage, attentions=kept), args, out_dir, dry_run)]
    print(f"== {stage.name}: {' '.join(argv[1:])}", flush=True)
    begin = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=max(1.0, remaining_s))
        status = "done" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as timeout:
        status = "cut at the deadline"
        output = "".join(part.decode() if isinstance(part, bytes) else (part or "")
                         for part in (timeout.stdout, timeout.stderr))
    seconds = time.monotonic() - begin
    records = read_records(out_dir)
    print(output[-3000:], flush=True)
    return {"stage": dataclasses.asdict(stage), "command": argv[1:], "status": status, "seconds": seconds,
            "records": records, "not_run": not_run, "output_tail": output[-4000:]}


def summary_rows(reports):
    """One row per run: stage, attention, accuracy (or why not), seconds per step, status."""
    rows = []
    for report in reports:
        name = report["stage"]["name"]
        if not report.get("records"):
            rows.append(f"{name:24} {'-':16} {'-':>8} {'-':>9}  {report['status']}")
        for record in report.get("records", []):
            verdict = record.get("status", "?")
            rows.append(f"{name:24} {record['attention']:16} {record['accuracy']:8.4f} "
                        f"{record['seconds_per_step']:9.4f}  {verdict}")
    return [f"{'stage':24} {'attention':16} {'accuracy':>8} {'s/step':>9}  status"] + rows


def markdown(summary):
    """A saved run's table (DIR/summary.json, or its copy in docs/data): one row per stage and attention, the
    model with no attention (run.py's floor) first; a run that did not beat it is named failed, with no accuracy;
    an attention of the stage with no record says why (left out, or the stage failed or was cut before it)."""
    lines = ["| stage | tokens | pairs | width | steps x batch | attention | test accuracy | s/step | status |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for report in summary["stages"]:
        stage = report["stage"]
        cells = (f"| {stage['name']} | {stage['length']:,} | {stage['pairs']} | {stage['width']} | "
                 f"{stage['steps']:,} x {stage['batch_size']} |")
        if not report.get("records"):
            lines.append(f"{cells} – | – | – | {report['status']} |")
        for record in report.get("records", []):
            status = record.get("status", "?")
            accuracy = f"{record['accuracy']:.4f}" if status in ("ok", "floor") else "–"
            name = "none (floor)" if record["attention"] == "none" else record["attention"]
            lines.append(f"{cells} {name} | {accuracy} | {record['seconds_per_step']:.4f} | {status} |")
        if report.get("records"):
            recorded = {record["attention"] for record in report["records"]}
            for name in stage["attentions"]:
                if name not in recorded:
                    why = report.get("not_run", {}).get(name) or f"stage {report['status']}"
                    lines.append(f"{cells} {name} | – | – | no record: {why} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder of the stages' JSON and run.py's results (required unless --render)")
    parser.add_argument("--render", metavar="FILE", help="print the Markdown table of a saved summary.json, and stop")
    parser.add_argument("--deadline", type=float, default=400.0, help="seconds for everything. Default: %(default)s")
    parser.add_argument("--lr", type=float, default=3e-3, help="the one learning rate. Default: %(default)s")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="Default: 0")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in STAGES], help="these stages only")
    parser.add_argument("--dry-run", action="store_true",
                        help="check every stage's plan and train the first stage of YOSO against softmax at a "
                             "tiny size (no GPU needed)")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            print(markdown(json.load(f)))
        return []
    if not args.out:
        parser.error("--out is required (a folder for the stages' records), unless --render FILE")
    if args.deadline <= 0:
        parser.error(f"--deadline must be > 0 seconds, got {args.deadline}")
    start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    check_plans(args)
    env = environment()
    write_json(os.path.join(args.out, "environment.json"), env)
    print(f"environment: {env}", flush=True)
    if not args.dry_run and env.get("platform") != "gpu":
        print("!! JAX sees no GPU: nothing trained (these sizes are for a GPU; --dry-run checks the plan)",
              flush=True)
    stages = [s for s in STAGES if not args.only or s.name in args.only]
    reports, seconds_per_token = [], None
    # The dry run trains the first stage of YOSO against softmax (the baselines' stage needs keras-hub's layers).
    dry = [next((s for s in stages if {"yoso", "softmax"} <= set(s.attentions)), stages[0])]
    for stage in dry if args.dry_run else stages:
        left = args.deadline - (time.monotonic() - start)
        estimate = stage.estimate_s if seconds_per_token is None else \
            seconds_per_token * stage.tokens * (len(stage.attentions) + 1)
        if args.dry_run:
            report = run_stage(stage, args, left, dry_run=True)
        elif env.get("platform") != "gpu":
            report = {"stage": dataclasses.asdict(stage), "status": "skipped: no GPU", "records": []}
        elif left < estimate:
            report = {"stage": dataclasses.asdict(stage), "records": [],
                      "status": f"skipped: {max(left, 0.0):.0f} s left, estimated {estimate:.0f} s"}
        else:
            report = run_stage(stage, args, left, unavailable=env.get("unavailable"))
            runs = len(report["records"]) or 1
            if report["status"] == "done":
                seconds_per_token = report["seconds"] / (stage.tokens * runs)
        report["environment"] = env
        write_json(os.path.join(args.out, f"{stage.name}.json"), report)
        reports.append(report)
    write_json(os.path.join(args.out, "summary.json"), {"environment": env, "stages": reports,
                                                         "deadline_s": args.deadline,
                                                         "seconds": time.monotonic() - start})
    print("\n".join(summary_rows(reports)), flush=True)
    return reports


if __name__ == "__main__":
    main()
