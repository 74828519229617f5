"""How a program of tests/programs/ runs the cases named on its command line: each on its own, so that
one failure hides no other; tests/conftest.py's check_program_case reads the report."""

import sys
import traceback


def run_cases(checks, names, *args):
    """Runs checks[name](*args) for each name in `names`, each on its own (one failure hides no other):
    prints "PASS <name>" or "FAIL <name>: <traceback>" for each, then "ok" when all passed, else exits
    with status 1 naming the failed ones."""
    unknown = [name for name in names if name not in checks]
    assert names and not unknown, f"cases {unknown or names}: expected some of {sorted(checks)}"
    failed = []
    for name in names:
        try:
            checks[name](*args)
            print("PASS", name, flush=True)
        except Exception:
            failed.append(name)
            print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
    if failed:
        sys.exit(f"failed: {failed}")
    print("ok")
