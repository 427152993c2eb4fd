"""Fuzz chaoskit's inputs: 10 000 mutated experiment documents (the bundled ones with lines deleted,
duplicated, re-indented, truncated, values replaced by junk) through every pass that reads a file — the
validating loader and its warnings (the lint), `chaoskit validate` through the real CLI in-process, and, for
each document that validates, `chaoskit run --dry-run` (the plan and the host's preflight; nothing applied) —
and 2 000 random CLI argument lists through the real CLI in-process (`run` only with --dry-run). Every outcome
must be valid (0) or a clear error (exit 2; 4 for a dry run's preflight): a traceback, an unexpected exception,
a lint that could not run or an engine "internal error" is a crash.

    .venv/bin/python bench/fuzz.py [--docs 10000] [--args 2000] [--seed 1]

Last line: `RESULT docs=N docs_ok=N docs_invalid=N doc_crashes=N validate_crashes=N dry_runs=N dry_crashes=N
args=N arg_crashes=N docs_per_s=R goal_met=B` (goal: no crash of any kind; exit 1 when missed).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from typer.testing import CliRunner, Result  # noqa: E402

from chaoskit.cli.main import app  # noqa: E402
from chaoskit.experiment.loader import LINT_FAILED  # noqa: E402
from tests.helpers.fuzzdocs import SEEDS, check_document, mutate  # noqa: E402

WORDS = ["run", "validate", "--var", "x=1", "=", "--dry-run", "--junit", "--out", "--all", "--ledger", "/nonexistent",
         "rollback", "schema", "list", "version", "--json", "-x", "--var=a", "a b", "", "--plain", "--live",
         "experiments/basic/memory-pressure.yaml", "experiments/network/drop.yaml", "--force", "é", "-"]
LIBRARY = ROOT / "experiments"


def crashed(r: Result, codes: tuple[int, ...]) -> str | None:
    """Why a CLI call's outcome is a crash (None: a clean exit with one of `codes`)."""
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        return "".join(traceback.format_exception(r.exception, limit=-4))
    if r.exit_code not in codes:
        return f"exit {r.exit_code}"
    for line in r.output.splitlines():
        if "Traceback" in line or LINT_FAILED in line or "internal error" in line:
            return line
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--args", type=int, default=2_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    counts = {"ok": 0, "invalid": 0}
    validate_crashes = dry_runs = dry_crashes = 0
    crashes: list[str] = []
    runner = CliRunner()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CHAOSKIT_STATE_DIR"] = str(Path(tmp) / "state")
        shutil.copytree(LIBRARY, Path(tmp) / "experiments")  # the CLI gets copies to (mis)use
        os.chdir(tmp)
        t0 = time.perf_counter()
        for i in range(a.docs):
            seed = rng.choice(SEEDS)
            # beside its seed's copy: {experiment.dir}/data files and probes/ faults/ includes resolve as for it
            f = Path(tmp) / "experiments" / seed.relative_to(LIBRARY).parent / "_fuzz.yaml"
            f.write_text(mutate(seed.read_text(), rng))
            kind = None
            try:
                kind = check_document(f)
                counts[kind] += 1
            except Exception:
                crashes.append(f"doc {i} (load): {traceback.format_exc(limit=-4)}\n{f.read_text()[:400]}")
            why = crashed(runner.invoke(app, ["validate", str(f)]), (0, 2))
            if why:
                validate_crashes += 1
                crashes.append(f"doc {i} (validate): {why}\n{f.read_text()[:400]}")
            if kind == "ok":
                dry_runs += 1
                why = crashed(runner.invoke(app, ["run", "--dry-run", "--plain", str(f)]), (0, 2, 4))
                if why:
                    dry_crashes += 1
                    crashes.append(f"doc {i} (run --dry-run): {why}\n{f.read_text()[:400]}")
            f.unlink()
        docs_s = time.perf_counter() - t0
        originals = {p: p.read_bytes() for p in (Path(tmp) / "experiments").rglob("*.yaml")}
        arg_crashes = 0
        for _ in range(a.args):
            args = [rng.choice(WORDS) for _ in range(rng.randint(0, 5))]
            if "run" in args and "--dry-run" not in args:
                args.append("--dry-run")
            r = runner.invoke(app, args)
            if (r.exception is not None and not isinstance(r.exception, SystemExit)) or r.exit_code not in (0, 2, 4):
                arg_crashes += 1
                crashes.append(f"args {args}: exit {r.exit_code} {r.exception!r}")
        ledgers = list((Path(tmp) / "state" / "ledgers").glob("*.jsonl"))
        changed = [str(p) for p, data in originals.items() if p.read_bytes() != data]
        crashes += [f"the CLI wrote to {p}" for p in changed]
        crashes += [f"a dry run or an invalid file wrote the ledger {p}" for p in ledgers]
        os.chdir(ROOT)
    doc_crashes = a.docs - counts["ok"] - counts["invalid"]
    print(f"documents: {a.docs} in {docs_s:.1f}s: {counts['ok']} valid, {counts['invalid']} clear errors, "
          f"{doc_crashes} loader/lint crashes, {validate_crashes} `validate` crashes, {dry_runs} dry runs "
          f"({dry_crashes} crashes)")
    print(f"CLI argument lists: {a.args}, crashes {arg_crashes}; ledgers written: {len(ledgers)}; "
          f"input files changed: {len(changed)}")
    for c in crashes[:5]:
        print(c)
    print(f"RESULT docs={a.docs} docs_ok={counts['ok']} docs_invalid={counts['invalid']} doc_crashes={doc_crashes} "
          f"validate_crashes={validate_crashes} dry_runs={dry_runs} dry_crashes={dry_crashes} args={a.args} "
          f"arg_crashes={arg_crashes} docs_per_s={a.docs / docs_s:.0f} goal_met={not crashes}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
