"""Fuzz chaoskit's inputs: 10 000 mutated experiment documents (the bundled ones with lines deleted,
duplicated, re-indented, truncated, values replaced by junk) through the validating loader, and 2 000 random
CLI argument lists through the real CLI in-process (`run` only with --dry-run). Every outcome must be valid
(0) or a clear error (exit 2; 4 for a dry run's preflight): a traceback is a crash.

    .venv/bin/python bench/fuzz.py [--docs 10000] [--args 2000] [--seed 1]

Last line: `RESULT docs=N docs_ok=N docs_invalid=N doc_crashes=N args=N arg_crashes=N docs_per_s=R`.
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

from typer.testing import CliRunner  # noqa: E402

from chaoskit.cli import app  # noqa: E402
from tests.helpers.fuzzdocs import SEEDS, check_document, mutate  # noqa: E402

WORDS = ["run", "validate", "--var", "x=1", "=", "--dry-run", "--junit", "--out", "--all", "--ledger", "/nonexistent",
         "rollback", "schema", "list", "version", "--json", "-x", "--var=a", "a b", "", "--plain", "--live",
         "experiments/basic/memory-pressure.yaml", "experiments/network/drop.yaml", "--force", "é", "-"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--args", type=int, default=2_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    counts = {"ok": 0, "invalid": 0}
    crashes: list[str] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "fuzz.yaml"
        for i in range(a.docs):
            f.write_text(mutate(rng.choice(SEEDS).read_text(), rng))
            try:
                counts[check_document(f)] += 1
            except Exception:
                crashes.append(f"doc {i}: {traceback.format_exc(limit=3)}\n{f.read_text()[:400]}")
        docs_s = time.perf_counter() - t0
        os.environ["CHAOSKIT_STATE_DIR"] = str(Path(tmp) / "state")
        shutil.copytree(ROOT / "chaoskit/library/experiments", Path(tmp) / "experiments")  # the CLI gets copies to (mis)use
        os.chdir(tmp)
        originals = {p: p.read_bytes() for p in (Path(tmp) / "experiments").rglob("*.yaml")}
        arg_crashes = 0
        runner = CliRunner()
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
        os.chdir(ROOT)
    print(f"documents: {a.docs} in {docs_s:.1f}s: {counts['ok']} valid, {counts['invalid']} clear errors, "
          f"{a.docs - counts['ok'] - counts['invalid']} crashes")
    print(f"CLI argument lists: {a.args}, crashes {arg_crashes}; ledgers written: {len(ledgers)}; "
          f"input files changed: {len(changed)}")
    for c in crashes[:5]:
        print(c)
    print(f"RESULT docs={a.docs} docs_ok={counts['ok']} docs_invalid={counts['invalid']} "
          f"doc_crashes={a.docs - counts['ok'] - counts['invalid']} args={a.args} arg_crashes={arg_crashes} "
          f"docs_per_s={a.docs / docs_s:.0f}")
    return 1 if crashes or ledgers else 0


if __name__ == "__main__":
    sys.exit(main())
