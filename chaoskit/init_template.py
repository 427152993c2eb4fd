"""The commented experiment `chaoskit init` writes: health probe, gentle SLO load, one safe fault, a safeguard."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field

from chaoskit.init_detect import Detected

RATE = 2  # requests per second: gentle
WIDTH = 108  # comment lines
PLACEHOLDER_MODEL = "MODEL"


@dataclass
class Plan:
    """What to write: where the service is, what was found there, and which fault."""

    url: str  # http://host:port, no path
    name: str
    found: Detected
    proxy_port: int | None = None  # the llm.proxy fault (no access to the server's host needed)
    pid: int | None = None  # or a process.signal pause of this process ...
    process_name: str | None = None  # ... or of the processes this regex names
    file: str = "THIS_FILE"  # as the next commands name it
    todos: list[str] = field(default_factory=list)  # what the user must check (besides what was not detected)

    @property
    def api(self) -> str:
        return self.found.kind if self.found.kind in ("openai", "triton", "http") else "openai"

    @property
    def signal(self) -> bool:
        return self.pid is not None or self.process_name is not None


def q(value: str) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is valid YAML)."""
    return json.dumps(value)


def render(plan: Plan) -> str:
    parts = [_header(plan), _doc(plan), _vars(plan), _probes(plan), _safeguards(plan), _method(plan)]
    return "\n".join(parts)


def _header(plan: Plan) -> str:
    f = plan.found
    found = _comment(f"Detected: {_KIND[f.kind]} at {plan.url} ({f.evidence})." if f.kind else
                     f"NOT DETECTED: nothing answered at {plan.url}, so this is a template: check every line "
                     "marked TODO.")
    notes = "".join(_comment(f"TODO: {n}") for n in [*f.notes, *plan.todos])
    return (f"# {plan.name}: a first chaos experiment for {plan.url}, written by `chaoskit init`.\n"
            f"{found}{notes}#\n{_fault_story(plan)}#\n{_hypothesis_story(plan)}#\n"
            "# Next:\n"
            + _c(f"#   chaoskit validate {plan.file}", "names file:line:column of any mistake", 50) + "\n"
            + _c(f"#   chaoskit run --dry-run {plan.file}", "the exact plan; nothing is applied", 50) + "\n"
            + _c(f"#   chaoskit run {plan.file}", "exit 0 held, 1 deviated, 3 aborted by the safeguard", 50) + "\n"
            "# Any variable under vars: can be changed for one run: --var NAME=VALUE (e.g. --var duration=10s).\n"
            "#\n" + _FIX_STORY)


_KIND = {"openai": "an OpenAI-compatible server", "triton": "a Triton (KServe v2) server",
         "http": "a plain HTTP server", None: "nothing"}


def _comment(text: str) -> str:
    """A paragraph as comment lines of at most WIDTH characters."""
    return "\n".join(textwrap.wrap(text, WIDTH, initial_indent="# ", subsequent_indent="# ",
                                   break_long_words=False, break_on_hyphens=False)) + "\n"


def _fault_story(plan: Plan) -> str:
    if plan.signal:
        who = (f"process {plan.pid}" if plan.pid is not None
               else f"every process whose name matches /{plan.process_name}/")
        return _comment(f"The fault: {who} is stopped with SIGSTOP for 5 s (vars.pause), then resumed with SIGCONT, "
                        "like a long GC pause or a stuck worker. chaoskit must run on the server's host, as a user "
                        "allowed to signal it. The revert (SIGCONT) is ledgered first: a run killed meanwhile still "
                        "resumes it (its watchdog, or `chaoskit rollback --all`).")
    what = ("requests (a plain HTTP server: every path)" if plan.api == "http" else
            "inference requests (completions, chat, generate, infer; not health or metadata)")
    return _comment(f"The fault needs no access to the server's host: an llm.proxy starts on "
                    f"127.0.0.1:{plan.proxy_port} in front of the server and answers 5% of {what} with 503, without "
                    "forwarding them; everything else passes through unchanged, and nothing on the server changes. "
                    "The slo probe's load goes through the proxy. To watch your own client meet the fault, point it "
                    f"at http://127.0.0.1:{plan.proxy_port} while the run is on (the proxy runs here, on the machine "
                    "that runs chaoskit).")


def _hypothesis_story(plan: Plan) -> str:
    if plan.signal:
        return _comment("The hypothesis: after a 5 s pause the server recovers: within 30 s of SIGCONT it answers "
                        "the same gentle load as before, without errors and with p99 under 5 s. While the process "
                        "is stopped nothing it serves can answer, so nothing is judged then; the safeguard watches "
                        "instead.")
    return _comment("The hypothesis: while 5% of requests fail at the proxy, the rest are served as before (no "
                    "timeouts, no connection errors, p99 under 5 s), and the server answers normally after the "
                    "fault.")


_FIX_STORY = """\
# The --var fix pattern: once a run shows a weakness, keep one file for before and after the fix.
# Declare the variable with today's value and let what the fix changes depend on it:
#   vars: {fix: false}                    then "{var.fix}" in any field (substituted as written)
#   target.reference.when: {fix: {...}}   settings of a deployment chaoskit brings up itself, laid over
#                                         when fix is true (see sits2026/health-check-blindspot)
# `chaoskit run FILE` shows the weakness (exit 1); `chaoskit run FILE --var fix=true` shows the fix
# holds (exit 0). For a service of your own the fix often lives elsewhere (a retrying client, a gateway
# setting, a new build on another port): give what differs as a variable, e.g. --var url=http://host:8001.
"""


def _doc(plan: Plan) -> str:
    fault = "process.signal" if plan.signal else "llm.proxy"
    what = ("a 5 s SIGSTOP pause of its process; it recovers to its SLO" if plan.signal
            else "5% of requests answered 503 by a proxy in front of it; the other 95% keep the SLO")
    return ("apiVersion: chaoskit/v1\nkind: Experiment\nmetadata:\n"
            f"  name: {q(plan.name)}\n"
            f"  description: {q(what)}\n"
            f"  tags: [init, {fault}]\n")


def _c(text: str, comment: str, col: int = 38) -> str:
    """A line with a comment from column `col` (or one space after a long text)."""
    return f"{text}{' ' * max(1, col - len(text))}# {comment}"


def _vars(plan: Plan) -> str:
    f = plan.found
    lines = [_c(f"  url: {q(plan.url)}", "the server's root: --var url=http://host:port")]
    if plan.api == "http":
        lines.append(_c(f"  path: {q(f.health_path)}", "the path the load requests and the health probe checks"))
    else:
        todo = "   TODO: not detected" if f.model is None else ""
        lines.append(_c(f"  model: {q(f.model or PLACEHOLDER_MODEL)}", f"a model it serves{todo}"))
    if plan.pid is not None:
        lines.append(_c(f"  pid: {plan.pid}", "the process to pause: --var pid=$(pgrep -o -f my-server)"))
    if plan.process_name is not None:
        lines.append(_c(f"  process: {q(plan.process_name)}", "regex on the process name (comm, 15 characters)"))
    if plan.signal:
        lines.append(_c("  pause: 5s", "how long the process stays stopped"))
    else:
        lines += [_c(f"  proxy_port: {plan.proxy_port}", "the proxy listens on 127.0.0.1:proxy_port (free now)"),
                  _c("  share: 5%", "share of requests answered 503"),
                  _c("  duration: 30s", "how long the proxy stays in front of the server")]
    return "vars:\n" + "\n".join(lines) + "\n"


def _health_url(plan: Plan) -> str:
    f = plan.found
    if plan.api == "openai":
        return "{url}/v1/models"
    if plan.api == "triton":
        return "{url}/v2/models/{model}/ready" if f.model else "{url}/v2/health/ready"
    return "{url}{path}"


def _health_probe(plan: Plan) -> str:
    status = plan.found.health_status if plan.found.kind else 200
    expect = "{status: 200}" if status == 200 else '{status: "< 500"}'
    return ("    - name: server-ready                # straight to the server, before and after the fault\n"
            "      type: http\n"
            f"      url: {q(_health_url(plan))}\n"
            "      phases: [before, after]\n"
            "      timeout: 2s\n"
            f"      expect: {expect}\n")


def _load(plan: Plan, through_proxy: bool, duration: str) -> str:
    base = "http://127.0.0.1:{proxy_port}" if through_proxy else "{url}"
    if plan.api == "http":
        shape = f"url: {q(base + '{path}')}, api: http, method: GET"
    else:
        shape = f"url: {q(base)}, api: {plan.api}, model: \"{{model}}\", stream: false,\n" \
                "             prompt_tokens: 64, max_tokens: 16"
    return (f"      load: {{{shape},\n"
            f"             rate: {RATE}, duration: {duration}, arrival: constant, timeout: 10s}}\n")


def _slo_probes(plan: Plan) -> str:
    direct = ("    - name: slo-direct                  # gentle load straight to the server: the baseline, and\n"
              "      type: slo                         # after the fault: recovered to it\n"
              "      phases: [before, after]\n"
              + _load(plan, False, "5s") +
              '      expect: {error_rate: "== 0", p99_ms: "< 5000"}     # TODO: your SLO\n')
    if plan.signal:
        return direct
    return (direct +
            "    - name: slo-through-proxy           # the same load through the proxy while the fault is on\n"
            "      type: slo\n"
            "      phases: [during]\n"
            "      mode: continuous\n"
            "      window: 10s                       # 20 requests a sample: about 1 meets the 5% storm\n"
            + _load(plan, True, "10s") +
            '      expect: {error_rate: "< 0.3", p99_ms: "< 5000", errors: {timeout: "== 0", connect: "== 0"}}\n')


def _probes(plan: Plan) -> str:
    during = (_c("  during: {every: 2s}", "the safeguard's pace while the process is stopped") if plan.signal
              else _c("  during: {every: 10s}", "a sample every 10 s while the fault is on"))
    after = _c("  after: {within: 30s, every: 2s}", "the hypothesis must hold again within 30 s of the revert")
    return "steadyState:\n  probes:\n" + _health_probe(plan) + _slo_probes(plan) + during + "\n" + after + "\n"


def _safeguards(plan: Plan) -> str:
    why = ("the server stays stopped longer than planned, or fails" if plan.signal
           else "the server itself (not the proxy) stops answering or fails")
    rules = _c('    abort_when: ["latency_ms > 8000", "status >= 500"]',
               "keep latency_ms above a longer pause" if plan.signal else "no answer within 8 s, or a 5xx")
    return (_comment(f"The safeguard stops the run early (and reverts everything) if {why}.") +
            "safeguards:\n"
            f"  - probe: {{name: server-alive, type: http, url: {q(_health_url(plan))}, timeout: 10s}}\n"
            f"{rules}\n"
            "    on_error: abort                   # no answer at all (refused, reset) aborts too\n"
            "    every: 2s\n")


def _method(plan: Plan) -> str:
    if plan.signal:
        target = "pid: \"{pid}\"" if plan.pid is not None else "name: \"{process}\""
        return ("method:\n  - name: pause-process\n    inject:\n      type: process.signal\n"
                f"      {target}\n"
                "      signal: SIGSTOP                   # revert: SIGCONT\n"
                "    duration: \"{pause}\"\n")
    match = "          match: {path: \"/*\"}             # every path (a plain HTTP server)\n" \
        if plan.api == "http" else ""
    return ("method:\n  - name: 503-storm\n    inject:\n      type: llm.proxy\n"
            "      listen: \"127.0.0.1:{proxy_port}\"\n"
            "      upstream: \"{url}\"\n"
            "      faults:                           # add retry_after: 1 for 503 + Retry-After (an overloaded pool)\n"
            "        - type: abort\n          name: storm\n          status: 503\n          share: \"{share}\"\n"
            + match +
            "    duration: \"{duration}\"\n")
