"""Load generator benchmark: `chaoskit load`'s max kept-up rate vs `wrk` and `vllm bench serve`; its CO accuracy.

The rate is the highest open-loop one at which the server kept up; the anchors run at their best settings.

Endpoint: nginx (Debian) on 127.0.0.1 returning a fixed OpenAI streaming completion (an SSE body of a few `data:`
chunks and `data: [DONE]`) for POST /v1/completions; every tool drives the same endpoint in the same run.

One trial policy for every tool: TRIALS (3) trials of BENCH_TRIAL_S seconds (whole seconds: wrk takes no less)
per setting, a setting's value the median of its trials, a tool's value that of its best setting.
- wrk (closed loop, as fast as it goes) at threads 1 and 2 x connections 16, 64 and 256: the best median req/s is
  the anchor; its (max - min) / median over those trials is `wrk_spread`. Then wrk at that setting with a Lua
  response() that checks every answer as chaoskit does (its SSE lines, `data: [DONE]`, 4 `"text": "<not
  empty>"` events; a run with an answer that fails the check stops the bench): `rate_vs_wrk_parsing`. wrk by
  itself reads the body without looking at it, chaoskit parses each answer; the goal is judged on plain wrk.
- `vllm bench serve` (request rate inf) at max concurrency 16, 64 and 256, only when the vLLM engine venv exists
  (`make vllm`); each setting first sends a sizing batch so that its trials last BENCH_TRIAL_S.
- chaoskit (constant arrivals, api openai, default sender) at 1 and 2 workers: a rate counts when, at some
  worker count, the median trial kept up (2 of 3; the third is skipped once two agree): completions/s
  >= 0.97 x the rate, <= 1% of sends more than 1 ms late, no errors, every answer's 4 tokens parsed, and
  p99 (from the intended send) <= 10 x the p99 at LOW_RATE measured first in this run (floored at 0.5 ms).
  The max rate is found by doubling from START_RATE, then BISECT_STEPS bisections.

Coordinated omission: a server that answers at once except that every request arriving while
(t mod T) < S waits until that window ends (S = 0.5 s, T = 2 s; tests/helpers/timed_server.py), at 200/s for
whole periods, with at most CO_CAP = 2 requests in flight. Analytic p99 from the intended send: a request
intended at phase p < S of its period is answered at S, so its latency is S - p; 25% (S/T) of the requests
are so delayed, uniformly in (0, S], so P(latency > x) = (S - x) / T and the p99 is S - 0.01 T = 480 ms.
Measured from the actual send (uncorrected) the same run shows ~1 ms: only the first CO_CAP requests of each
stall are on the wire waiting (2 of the 400 a period, fewer than the 1% that decide the p99), the other ~98
wait in the sender and leave when the stall ends. `co_p99_error` (corrected vs 480 ms) must be small (the
backlog of ~100 requests drains after each stall, which can add up to ~1%); `co_uncorrected_p99_error`
(uncorrected vs 480 ms) must be large (~1), which shows the case tells a correct measurement from an
omitting one.

RESULT keys: rate_vs_wrk (chaoskit max rate / wrk req/s), rate_vs_wrk_parsing (/ wrk req/s with the Lua check,
unjudged), rate_vs_vllm_bench (when vLLM is present), co_p99_error, co_uncorrected_p99_error (fractions),
wrk_spread, chaoskit_max_rps, wrk_rps, wrk_parsing_rps, sender (the chaoskit sender measured: native unless it
cannot be built here), goal_met, missed= (the goals missed).

Goals (GOALS below; exit 1 when one is missed; `--goal key=value` sets one for a run, see bench/goals.py):
rate_vs_wrk >= 0.8; co_p99_error <= 0.05 (the bound tests/integration/test_load.py holds the sender to) and
co_uncorrected_p99_error >= 0.5 (the case still tells an omitting measurement from a correct one);
rate_vs_vllm_bench >= 10 where the vLLM venv exists (else unjudged).
Needs root or the packages `nginx-light` and `wrk` (installed with apt when missing).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoskit.load import native
from chaoskit.load.runner import run_load
from chaoskit.load.spec import LoadSpec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from goals import Goal, Goals  # noqa: E402

GOALS = Goals(Goal("rate_vs_wrk", ">=", 0.8, "chaoskit's max kept-up rate / wrk's best median req/s"),
              Goal("co_p99_error", "<=", 0.05, "|CO-corrected p99 - analytic| / analytic, stall case"),
              Goal("co_uncorrected_p99_error", ">=", 0.5, "the p99 from the actual send is visibly wrong"),
              Goal("rate_vs_vllm_bench", ">=", 10, "chaoskit's max kept-up rate / vllm bench serve's"))

ROOT = Path(__file__).resolve().parent.parent
STALL_SERVER = ROOT / "tests" / "helpers" / "timed_server.py"
VLLM_TRIALS = ROOT / "tests" / "helpers" / "vllm_bench_trials.py"
TRIAL_S = max(1, round(float(os.environ.get("BENCH_TRIAL_S", "2"))))
TRIALS = 3
WRK_SETTINGS = [(threads, conns) for threads in (1, 2) for conns in (16, 64, 256)]
VLLM_CONCURRENCY = (16, 64, 256)
WORKER_OPTIONS = (1, 2)
LOW_RATE, START_RATE, RATE_LIMIT, BISECT_STEPS = 1000.0, 2000.0, 512_000.0, 3
KEEP_UP, LATE_MAX, P99_FACTOR, P99_FLOOR_MS = 0.97, 0.01, 10.0, 0.5
CO_S, CO_T, CO_RATE, CO_CAP, CO_PERIODS = 0.5, 2.0, 200.0, 2, 2
CO_ANALYTIC_MS = (CO_S - 0.01 * CO_T) * 1e3
TOKENS = 4
POST_LUA = ('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            'wrk.body = \'{"model":"m","prompt":"hello","max_tokens":4,"stream":true}\'\n')
PARSE_LUA = POST_LUA + """
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; bad = 0 end
function response(status, headers, body)
  local tokens, done = 0, false
  for line in body:gmatch("[^\\n]+") do
    local data = line:match("^%s*data:(.*)")
    if data then
      if data:find("[DONE]", 1, true) then done = true
      elseif data:find('"error"%s*:') then tokens = -1
      else for _ in data:gmatch('"text"%s*:%s*"[^"]') do tokens = tokens + 1 end end
    end
  end
  if status == 200 and done and tokens == TOKENS then ok = ok + 1 else bad = bad + 1 end
end
function done(summary, latency, requests)
  local o, b = 0, 0
  for _, t in ipairs(threads) do o = o + t:get("ok"); b = b + t:get("bad") end
  io.write(string.format("checked ok %d bad %d\\n", o, b))
end
"""
SSE = "".join(f'data: {{"choices":[{{"text":"t{i}","index":0}}]}}\\n\\n' for i in range(TOKENS)) + \
    "data: [DONE]\\n\\n"


@dataclass(frozen=True)
class Anchor:
    """One tool at its best setting: the trial values of that setting (req/s)."""
    tool: str
    setting: str
    trials: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.trials)

    @property
    def spread(self) -> float:
        return (max(self.trials) - min(self.trials)) / self.median

    def line(self) -> str:
        return (f"{self.tool} best setting {self.setting}: median {self.median:.0f} req/s, trials "
                f"{min(self.trials):.0f}..{max(self.trials):.0f} (spread {self.spread:.1%})")


@dataclass(frozen=True)
class Trial:
    """One chaoskit load run at a constant rate and what it says about the server keeping up."""
    rate: float
    workers: int
    completed_rps: float
    late_share: float
    errors: int
    tokens_ok: bool
    p99_ms: float

    def kept_up(self, p99_bound_ms: float) -> bool:
        return (self.completed_rps >= KEEP_UP * self.rate and self.late_share <= LATE_MAX and self.errors == 0
                and self.tokens_ok and self.p99_ms <= p99_bound_ms)


# ---------------------------------------------------------------- the endpoint

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_tools() -> None:
    missing = [p for p, b in (("nginx-light", "nginx"), ("wrk", "wrk")) if not shutil.which(b)]
    if missing:
        if os.geteuid() != 0:
            sys.exit(f"bench needs {' '.join(missing)} (apt install them)")
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, capture_output=True)


def start_nginx(tmp: Path, port: int) -> subprocess.Popen:
    conf = tmp / "nginx.conf"
    conf.write_text(f"""
worker_processes auto;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path {tmp}/body;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location = /v1/completions {{
      default_type text/event-stream;
      return 200 '{SSE}';
    }}
  }}
}}
""")
    proc = subprocess.Popen(["nginx", "-p", str(tmp), "-c", str(conf), "-g", "daemon off;"])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("nginx did not start")


def best_setting(tool: str, settings: dict[str, Callable[[], float]]) -> Anchor:
    """TRIALS trials of every setting; the setting with the best median."""
    anchors = []
    for name, once in settings.items():
        trials = tuple(once() for _ in range(TRIALS))
        anchors.append(Anchor(tool, name, trials))
        print(f"  {tool} {name}: " + ", ".join(f"{v:.0f}" for v in trials) + " req/s", flush=True)
    return max(anchors, key=lambda a: a.median)


# ---------------------------------------------------------------- wrk

def wrk_once(lua: Path, url: str, threads: int, conns: int) -> tuple[float, str]:
    """One wrk trial: its req/s and its output."""
    out = subprocess.run(["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{TRIAL_S}s", "-s", str(lua), url],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m:
        raise SystemExit(f"wrk gave no rate: {out[-400:]}")
    return float(m.group(1)), out


def wrk_anchor(tmp: Path, url: str) -> Anchor:
    lua = tmp / "post.lua"
    lua.write_text(POST_LUA)
    return best_setting("wrk", {f"-t {t} -c {c}": (lambda t=t, c=c: wrk_once(lua, url, t, c)[0])
                                for t, c in WRK_SETTINGS})


def wrk_parsing_anchor(tmp: Path, url: str, setting: str) -> Anchor:
    """wrk at `setting` ("-t T -c C") with a Lua response() that checks every answer as chaoskit does."""
    lua = tmp / "parse.lua"
    lua.write_text(PARSE_LUA.replace("TOKENS", str(TOKENS)))
    _, t, _, c = setting.split()

    def once() -> float:
        rps, out = wrk_once(lua, url, int(t), int(c))
        m = re.search(r"checked ok (\d+) bad (\d+)", out)
        if not m or int(m.group(2)) or not int(m.group(1)):
            raise SystemExit(f"wrk's Lua check of the answers failed: {out[-400:]}")
        return rps

    return best_setting("wrk (answers checked in Lua)", {setting: once})


# ---------------------------------------------------------------- chaoskit

def load_trial(base: str, rate: float, workers: int) -> Trial:
    spec = LoadSpec(url=base, api="openai", model="m", rate=rate, duration=TRIAL_S, arrival="constant",
                    max_tokens=TOKENS, prompt_tokens=8, workers=workers, timeout=5)
    s = asyncio.run(run_load(spec))
    s.pop("recorder", None)
    tokens = s.get("output_tokens")
    return Trial(rate=rate, workers=workers, completed_rps=s.get("completed_rps", s["ok"] / TRIAL_S),
                 late_share=s["late_share"], errors=sum(s["errors"].values()),
                 tokens_ok=tokens is None or tokens == TOKENS * s["ok"], p99_ms=s.get("p99_ms") or float("inf"))


def show(t: Trial, bound_ms: float | None) -> None:
    verdict = "" if bound_ms is None else (" -> kept up" if t.kept_up(bound_ms) else " -> not kept up")
    print(f"  chaoskit load {t.workers} worker(s) {t.rate:8.0f}/s: completed {t.completed_rps:8.0f}/s, late "
          f"{t.late_share:.2%}, errors {t.errors}, p99 {t.p99_ms:.2f} ms{verdict}", flush=True)


def low_rate_p99(base: str) -> float:
    """The p99 (ms) at LOW_RATE with one worker: the median of TRIALS trials."""
    trials = [load_trial(base, LOW_RATE, 1) for _ in range(TRIALS)]
    for t in trials:
        show(t, None)
    return statistics.median(t.p99_ms for t in trials)


def passes(base: str, rate: float, bound_ms: float) -> int | None:
    """The first worker count whose median trial at `rate` kept up (None: none did)."""
    need = TRIALS // 2 + 1
    for workers in WORKER_OPTIONS:
        good = bad = 0
        while good < need and bad < need:  # the majority of TRIALS decides; stop once it is known
            t = load_trial(base, rate, workers)
            show(t, bound_ms)
            good, bad = good + t.kept_up(bound_ms), bad + (not t.kept_up(bound_ms))
        if good >= need:
            return workers
    return None


def max_rate(base: str, bound_ms: float) -> tuple[float, int | None]:
    """Doubling from START_RATE while rates pass, then BISECT_STEPS bisections: the rate and its worker count."""
    lo, lo_workers, rate = 0.0, None, START_RATE
    while rate <= RATE_LIMIT and (w := passes(base, rate, bound_ms)) is not None:
        lo, lo_workers, rate = rate, w, rate * 2
    hi = rate
    for _ in range(BISECT_STEPS):
        mid = round((lo + hi) / 2)
        w = passes(base, mid, bound_ms)
        if w is None:
            hi = mid
        else:
            lo, lo_workers = mid, w
    return lo, lo_workers


# ---------------------------------------------------------------- vllm bench serve

def vllm_anchor(tmp: Path, base: str) -> Anchor | None:
    """`vllm bench serve` (request rate inf) at every VLLM_CONCURRENCY, in one process of the vLLM venv."""
    from chaoskit.reference import vllm

    if not vllm.installed():
        return None
    vllm.stub_dist_info()
    job = {"base_url": base, "tokenizer": str(vllm.model_dir(tmp)), "concurrencies": list(VLLM_CONCURRENCY),
           "trials": TRIALS, "trial_s": TRIAL_S, "calibrate_prompts": 500}
    r = subprocess.run([str(vllm.python()), str(VLLM_TRIALS), json.dumps(job)], capture_output=True, text=True,
                       env=vllm.env(tmp))
    runs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not runs:
        print(f"vllm bench serve failed (exit {r.returncode}): {r.stderr[-600:]}")
        return None
    anchors = []
    for conc in VLLM_CONCURRENCY:
        trials = [x for x in runs if x["concurrency"] == conc and x["kind"] == "trial"]
        print(f"  vllm bench serve --max-concurrency {conc}: " +
              ", ".join(f"{x['rps']:.0f} ({x['duration_s']:.1f} s)" for x in trials) + " req/s", flush=True)
        anchors.append(Anchor("vllm bench serve", f"--max-concurrency {conc}", tuple(x["rps"] for x in trials)))
    return max(anchors, key=lambda a: a.median)


# ---------------------------------------------------------------- coordinated omission

def co_trial() -> tuple[float, float]:
    """One run against the stall server: (p99 from the intended send, p99 from the actual send) in ms."""
    port = free_port()
    p = subprocess.Popen([sys.executable, str(STALL_SERVER), "stall", str(port), str(CO_S), str(CO_T)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout and p.stdout.readline().strip() == "ready"
        s: dict[str, Any] = asyncio.run(run_load(LoadSpec(
            url=f"http://127.0.0.1:{port}/", rate=CO_RATE, duration=CO_PERIODS * CO_T, arrival="constant",
            concurrency_cap=CO_CAP)))
    finally:
        p.kill()
        p.wait()
    corrected, uncorrected = s["p99_ms"], s.get("service_p99_ms")
    if uncorrected is None:
        raise SystemExit("the load summary has no service_p99_ms (p99 from the actual send)")
    print(f"  stall server: p99 {corrected:.1f} ms from the intended send, {uncorrected:.1f} ms from the actual "
          f"send (p90 {s.get('p90_ms', 0):.1f} vs {s.get('service_p90_ms', 0):.1f} ms)", flush=True)
    return corrected, uncorrected


def co_errors() -> tuple[float, float]:
    """Median over TRIALS runs: (|corrected - analytic|, |uncorrected - analytic|) / analytic."""
    runs = [co_trial() for _ in range(TRIALS)]
    corrected = statistics.median(c for c, _ in runs)
    uncorrected = statistics.median(u for _, u in runs)
    print(f"stall server (S {CO_S} s every T {CO_T} s, {CO_RATE:.0f}/s, cap {CO_CAP}): analytic p99 "
          f"{CO_ANALYTIC_MS:.0f} ms; median corrected {corrected:.1f} ms, uncorrected {uncorrected:.1f} ms")
    return abs(corrected - CO_ANALYTIC_MS) / CO_ANALYTIC_MS, abs(uncorrected - CO_ANALYTIC_MS) / CO_ANALYTIC_MS


# ---------------------------------------------------------------- main

def main() -> int:
    ensure_tools()
    t0 = time.monotonic()
    print(f"policy: {TRIALS} trials of {TRIAL_S} s per setting, median per setting, best setting per tool")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        port = free_port()
        nginx = start_nginx(tmp, port)
        try:
            base = f"http://127.0.0.1:{port}"
            sender = native.choose(LoadSpec(url=base, api="openai", model="m", rate=1, duration=1))
            print(f"chaoskit load: measuring the {sender} sender (sender auto for {base})")
            wrk = wrk_anchor(tmp, base + "/v1/completions")
            print(wrk.line())
            wrk_parse = wrk_parsing_anchor(tmp, base + "/v1/completions", wrk.setting)
            print(wrk_parse.line())
            ref = low_rate_p99(base)
            bound = P99_FACTOR * max(ref, P99_FLOOR_MS)
            print(f"chaoskit load: p99 at {LOW_RATE:.0f}/s {ref:.2f} ms; a rate keeps up with p99 <= {bound:.2f} ms")
            best, workers = max_rate(base, bound)
            print(f"chaoskit load: max rate the server kept up with: {best:.0f}/s ({workers} worker(s))")
            vb = vllm_anchor(tmp, base)
            print(vb.line() if vb else "vllm bench serve: the vLLM engine venv is not installed (`make vllm`); "
                  "rate_vs_vllm_bench is omitted")
        finally:
            nginx.terminate()
            nginx.wait()
    co, co_unc = co_errors()
    print(f"total {time.monotonic() - t0:.0f} s")
    keys: dict[str, Any] = {"rate_vs_wrk": f"{best / wrk.median:.3f}",
                            "rate_vs_wrk_parsing": f"{best / wrk_parse.median:.3f}"}
    if vb:
        keys["rate_vs_vllm_bench"] = f"{best / vb.median:.3f}"
    keys.update(co_p99_error=f"{co:.4f}", co_uncorrected_p99_error=f"{co_unc:.4f}", wrk_spread=f"{wrk.spread:.3f}",
                chaoskit_max_rps=f"{best:.0f}", wrk_rps=f"{wrk.median:.0f}",
                wrk_parsing_rps=f"{wrk_parse.median:.0f}", sender=sender)
    return GOALS.result(keys)


if __name__ == "__main__":
    sys.exit(main())
