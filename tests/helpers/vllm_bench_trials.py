"""Repeated `vllm bench serve` runs in one process of the vLLM venv (each CLI start costs ~15 s of imports).

Run with the vLLM venv's python: `python vllm_bench_trials.py JOB` where JOB is JSON {"base_url", "tokenizer",
"concurrencies": [..], "trials": N, "trial_s": S, "calibrate_prompts": K}. For each max-concurrency it first sends
K prompts to size the trials (discarded), then N trials of round(rate * S) prompts each, so every trial lasts
about S seconds; one JSON line a run on stdout ({"concurrency", "kind", "prompts", "rps", "duration_s"}); the
benchmark's own output goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser


def bench_once(job: dict[str, Any], concurrency: int, prompts: int) -> dict[str, Any]:
    """One `vllm bench serve` run: request rate inf, at most `concurrency` in flight."""
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", job["base_url"], "--endpoint", "/v1/completions", "--model", "m",
        "--tokenizer", job["tokenizer"], "--dataset-name", "random", "--random-input-len", "8",
        "--random-output-len", "4", "--num-prompts", str(prompts), "--request-rate", "inf",
        "--max-concurrency", str(concurrency), "--disable-tqdm", "--ignore-eos"])
    with contextlib.redirect_stdout(sys.stderr):
        return main(args)


def report(concurrency: int, kind: str, prompts: int, result: dict[str, Any]) -> float:
    rps = float(result["request_throughput"])
    print(json.dumps({"concurrency": concurrency, "kind": kind, "prompts": prompts, "rps": rps,
                      "duration_s": float(result["duration"])}), flush=True)
    return rps


def run(job: dict[str, Any]) -> None:
    for conc in job["concurrencies"]:
        k = int(job["calibrate_prompts"])
        rate = report(conc, "calibrate", k, bench_once(job, conc, k))
        n = max(100, round(rate * float(job["trial_s"])))
        for _ in range(int(job["trials"])):
            report(conc, "trial", n, bench_once(job, conc, n))


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
