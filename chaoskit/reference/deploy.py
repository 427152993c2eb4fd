"""`chaoskit ref up|down|status|logs`: start, stop and inspect the reference deployment's real processes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from chaoskit import __version__ as chaoskit_version
from chaoskit.errors import ChaoskitError, PreflightError
from chaoskit.reference import openai_stack, triton
from chaoskit.reference.httpcheck import http_answer, http_status
from chaoskit.reference.options import RefOptions
from chaoskit.targets import ref_registry
from chaoskit.targets.process import ProcessRef, group_members, is_alive, proc_ref, proc_state

READY_TIMEOUT_S = 180.0
CHECK_TIMEOUT_S = 5.0  # `ref status`: how long one replica's generate request may take
GENERATE_PROBE = {"text_input": "ready?", "max_tokens": 1}
UNREADY_GRACE_S = 3.0  # `down` of a deployment whose `up` never finished
PD_ENGINE = "tiny_lm-pd"  # the engine of a disaggregated deployment (chaoskit.reference.pd_server)
PD_PROBE = {"model": "tiny_lm", "prompt": "ready?", "max_tokens": 1}
OPENAI_ENGINES = ("vllm", "tiny-openai")


def ref_dir() -> Path:
    """Where `ref up` starts a deployment when told no --dir: $CHAOSKIT_REF_DIR, else .chaoskit/ref."""
    return ref_registry.default_dir()


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def replica_checks(engine: str) -> list[tuple[str, dict[str, Any]]]:
    """What `ref status` asks each replica: a real 1-token request to each model (path, JSON body)."""
    if engine == "triton":
        from chaoskit.targets.facts import TRITON_MODELS

        return [(f"/v2/models/{m}/generate", GENERATE_PROBE) for m in TRITON_MODELS]
    if engine == PD_ENGINE:
        return [("/health", {})]
    return [("/v1/completions", completion_probe(engine))]


def check_replica(url: str, engine: str) -> tuple[bool, str]:
    """(ready, what the checks found): ready when every model answered its 1-token request with a 2xx."""
    for path, body in replica_checks(engine):
        answer = http_answer(url + path, body or None, timeout=CHECK_TIMEOUT_S)
        if not answer.ok:
            return False, f"{'POST' if body else 'GET'} {path}: {answer.describe()}"
    if engine == PD_ENGINE:
        return True, "GET /health answered"
    return True, "1-token " + ("generate" if engine == "triton" else "completion") + " answered"


class Deployment:
    """The processes and namespaces one `ref up` created, recorded in the state dir as they are made."""

    def __init__(self, root: Path | None = None):
        self.root = (root or ref_dir()).resolve()
        self.logs = self.root / "logs"
        self.tag = hashlib.sha256(str(self.root).encode()).hexdigest()[:4]

    # ---------------------------------------------------------------- records

    def _load(self, name: str) -> Any:
        try:
            return json.loads((self.root / name).read_text())
        except (OSError, ValueError):
            return None

    def _save(self, name: str, data: Any) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.root / name)

    def processes(self) -> list[dict[str, Any]]:
        return self._load("processes.json") or []

    def facts(self) -> dict[str, Any] | None:
        return self._load("facts.json")

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True, cwd=self.root)
        ref = proc_ref(proc.pid) or ProcessRef(proc.pid, 0)
        entry = {"name": name, **ref.to_json(), "log": str(log), "argv": argv}
        self._save("processes.json", [*self.processes(), entry])  # recorded at once: a killed `up` is undoable
        return entry

    # ---------------------------------------------------------------- up

    def up(self, opts: RefOptions, say: Callable[[str], None] = print, register: bool = False) -> dict[str, Any]:
        """Start it; its facts. `register`: also record it in the registry of running deployments
        (chaoskit.targets.ref_registry), so that commands told no --dir find it (`chaoskit ref up` does; a run's own
        deployment is the run's, and tests' are their own)."""
        if self.processes():
            raise ChaoskitError(f"a reference deployment is already recorded in {self.root}; "
                                f"`{ref_registry.command('down', self.root)}` first "
                                f"(or `{ref_registry.command('status', self.root)}`)")
        if opts.engine == "vllm":
            from chaoskit.reference import vllm

            vllm.install(say)  # on demand: its own venv, once per checkout
        if opts.third_party and opts.disaggregated:
            raise ChaoskitError(f"gateway {opts.gateway}: a disaggregated deployment's gateway is chaoskit's PD router")
        if opts.netns and os.geteuid() != 0:
            raise PreflightError("--netns needs root (it creates network namespaces)")
        if opts.engine == "triton" and not opts.disaggregated and any(c.isspace() for c in str(self.root)):
            # Triton launches its python backend's stub through a shell, unquoted: the models never load
            raise PreflightError(f"{self.root}: tritonserver cannot load models from a directory whose path has "
                                 "white space (its python backend's stub is started by a shell, unquoted); "
                                 "choose a --dir without spaces")
        if not 1 <= opts.replicas <= 8:
            raise ChaoskitError("--replicas must be between 1 and 8")
        servers = sum(opts.disaggregated) if opts.disaggregated else opts.replicas
        extra = (2 if opts.third_party else 0) + opts.mcp  # a gateway's second listener, the tap's counters; tiny-mcp
        ports = [opts.port] + [opts.port + 1 + k for k in range(3 * servers + extra)]
        if opts.mcp:
            openai_stack.check_mcp()
        busy = [p for p in ports if not port_free("127.0.0.1", p)]
        if busy:
            raise PreflightError(f"ports in use: {', '.join(map(str, busy))}; choose another --port "
                                 f"(uses {ports[0]}..{ports[-1]})")
        if register:  # before anything starts: a killed `up` is found by `ref down` too
            try:
                ref_registry.register(self.root, PD_ENGINE if opts.disaggregated else opts.engine)
            except ChaoskitError as e:
                say(f"warning: {e}; commands find this deployment only with --dir {self.root}")
        t_start = time.monotonic()
        try:
            if opts.disaggregated:
                replicas = self._start_pd(opts, say)
            else:
                replicas = self._start_replicas(opts, say)
            gw = (openai_stack.start_gateway(self, opts, replicas, completion_probe(opts.engine), say)
                  if opts.third_party else self._start_gateway(opts, replicas, say))
            mcp = openai_stack.start_mcp(self, ports[-1], say) if opts.mcp else None
        except BaseException:
            say("start failed; stopping what was started")
            self.down(say=lambda _: None)
            raise
        r0 = replicas[0]
        engine = PD_ENGINE if opts.disaggregated else opts.engine
        facts = {
            "engine": engine, "url": gw["url"], "gateway_port": opts.port, "health_mode": opts.health,
            "replicas": replicas, "replica_url": r0["url"], "replica_host": r0["host"], "replica_port": r0["port"],
            "replica_metrics_url": r0["metrics_url"], "replica_pid": r0["pid"], "replica_pids": [r["pid"] for r in replicas],
            "model_repository": str(self.root / "model_repository"), "python": sys.executable,
            "model": completion_probe(engine)["model"] if engine in OPENAI_ENGINES else "tiny_lm",
            "startup_s": round(time.monotonic() - t_start, 2), "settings": opts.settings(),
            "gateway": {"kind": opts.gateway, "version": gw.get("version", chaoskit_version),
                        "config": gw.get("config", str(self.root / "gateway.json")),
                        "settings": " ".join(f"{k}={v}" for k, v in gw.get("settings", opts.health_settings()).items()),
                        "tap_log": gw.get("tap_log"), "tap_metrics": gw.get("tap_metrics")},
            "gateway_pid": gw["pid"],
        }
        if mcp is not None:
            facts["mcp"] = mcp
        if opts.netns:
            facts["netns"] = r0["netns"]
        if opts.disaggregated:
            prefill, decode = ([r for r in replicas if r["role"] == role] for role in ("prefill", "decode"))
            facts |= {"prefill_pid": prefill[0]["pid"], "prefill_pids": [r["pid"] for r in prefill],
                      "prefill_url": prefill[0]["url"], "decode_url": decode[0]["url"], "decode_pid": decode[0]["pid"],
                      "decode_kv": decode[0]["kv"], "decode_kv_port": int(decode[0]["kv"].rpartition(":")[2])}
            if opts.netns:
                facts["decode_netns"] = decode[0]["netns"]
        self._save("facts.json", facts)
        return facts

    @staticmethod
    def subnet_base(count: int, port: int) -> int:
        """8k for the first k such that no host address lies in 10.203.(8k .. 8k+count-1).0/24 (one /30 per
        replica). The search starts at a k the gateway's port picks: the check and the addresses' creation are not
        one step, so deployments started at once on distinct port blocks (two CI jobs, two test streams with their
        own CHAOSKIT_REF_FIRST_PORT) look at distinct subnets first."""
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            used = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=socket.AF_INET)}
        first = port // 40 % 32  # scenario.PORT_STRIDE: one k per port block
        for k in ((first + j) % 32 for j in range(32)):
            if not any(a and a.startswith(f"10.203.{8 * k + i}.") for a in used for i in range(count)):
                return 8 * k
        raise PreflightError("no free 10.203.x.0/30 subnets for --netns replicas")

    def create_netns(self, i: int, octet: int) -> tuple[str, str]:
        """Create namespace i with a veth to the host; return (name, replica address)."""
        from pyroute2 import IPRoute, netns

        name, host_if = f"ckref{self.tag}-{i}", f"ckr{self.tag}{i}h"
        host_ip, ns_ip = f"10.203.{octet}.1", f"10.203.{octet}.2"
        netns.create(name)
        self._save("netns.json", [*(self._load("netns.json") or []), name])
        with IPRoute() as ipr:
            ipr.link("add", ifname=host_if, kind="veth", peer={"ifname": "eth0", "net_ns_fd": name})
            idx = ipr.link_lookup(ifname=host_if)[0]
            ipr.addr("add", index=idx, address=host_ip, prefixlen=30)
            ipr.link("set", index=idx, state="up")
        with IPRoute(netns=name, flags=0) as ipr:
            for ifname in ("lo", "eth0"):
                idx = ipr.link_lookup(ifname=ifname)[0]
                ipr.link("set", index=idx, state="up")
            ipr.addr("add", index=ipr.link_lookup(ifname="eth0")[0], address=ns_ip, prefixlen=30)
        return name, ns_ip

    def _start_replicas(self, opts: RefOptions, say: Callable[[str], None]) -> list[dict[str, Any]]:
        if opts.engine == "tiny-openai":
            return openai_stack.start_replicas(self, opts, say)
        return self._start_triton(opts, say) if opts.engine == "triton" else self._start_vllm(opts, say)

    def _start_triton(self, opts: RefOptions, say: Callable[[str], None]) -> list[dict[str, Any]]:
        repo = triton.model_repository(self.root / "model_repository", opts.model_settings())
        backends = triton.backend_dir(self.root / "backends")
        env = {**triton.env(), "CHAOSKIT_REF_DIR": str(self.root)}
        replicas = []
        base = self.subnet_base(opts.replicas, opts.port) if opts.netns else 0
        for i in range(opts.replicas):
            http, grpc, metrics = (opts.port + 1 + 3 * i + k for k in range(3))
            ns, host = (self.create_netns(i, base + i) if opts.netns else (None, "127.0.0.1"))
            argv = triton.argv(repo, backends, host, http, grpc, metrics, self.shm_prefix(f"triton-{i}"))
            if ns:
                argv = [shutil.which("ip") or "/usr/sbin/ip", "netns", "exec", ns, *argv]
            p = self.spawn(f"triton-{i}", argv, env)
            url = f"http://{host}:{http}"
            replicas.append({"name": f"triton-{i}", "pid": p["pid"], "host": host, "port": http, "url": url,
                             "metrics_url": f"http://{host}:{metrics}/metrics", "netns": ns})
        for r in replicas:
            self.wait_ready(r["name"], lambda r=r: http_status(f"{r['url']}/v2/models/tiny_lm/ready") == 200
                       and http_status(f"{r['url']}/v2/models/tiny_lm_stream/ready") == 200, r["pid"])
            r["model_pids"] = triton.model_pids(r["pid"])  # the python backend stubs, started by now
            say(f"{r['name']} ready at {r['url']} (pid {r['pid']}, model processes "
                f"{', '.join(map(str, r['model_pids']))}{', netns ' + r['netns'] if r['netns'] else ''})")
        return replicas

    def _start_vllm(self, opts: RefOptions, say: Callable[[str], None]) -> list[dict[str, Any]]:
        from chaoskit.reference import vllm

        model = vllm.model_dir(self.root)
        replicas = []
        base = self.subnet_base(opts.replicas, opts.port) if opts.netns else 0
        for i, bind in enumerate(vllm.cpu_binds(opts.replicas)):
            port = opts.port + 1 + 3 * i
            ns, host = (self.create_netns(i, base + i) if opts.netns else (None, "127.0.0.1"))
            cmd = vllm.argv(model, host, port)
            env = vllm.env(self.root) | ({"VLLM_CPU_OMP_THREADS_BIND": bind} if bind else {})
            p = self.spawn(f"vllm-{i}", ["ip", "netns", "exec", ns, *cmd] if ns else cmd, env)
            url = f"http://{host}:{port}"
            replicas.append({"name": f"vllm-{i}", "pid": p["pid"], "host": host, "port": port, "url": url,
                             "metrics_url": f"{url}/metrics", "netns": ns, "cpus": bind})
        probe = completion_probe("vllm")
        for r in replicas:  # readiness = a real 1-token completion, not /health
            self.wait_ready(r["name"], lambda r=r: http_status(f"{r['url']}/v1/completions", probe, 30) == 200,
                            r["pid"])
            r["engine_pid"] = vllm.engine_core_pid(r["pid"])
            say(f"{r['name']} ready at {r['url']} (pid {r['pid']}, EngineCore {r['engine_pid']}"
                f"{', CPUs ' + r['cpus'] if r['cpus'] else ''})")
        return replicas

    def _start_pd(self, opts: RefOptions, say: Callable[[str], None]) -> list[dict[str, Any]]:
        """tiny_lm split (chaoskit.reference.pd_server): the decode servers first (each with its KV port), then
        the prefill servers; `replicas` are decode-0.., prefill-0.. in that order. With netns each decode server
        runs in a namespace of its own (the prefill servers reach its KV port over its veth: a fault on the KV
        path, kv.notify's interception included, acts in that namespace alone)."""
        assert opts.disaggregated is not None
        n_prefill, n_decode = opts.disaggregated
        params = json.dumps(opts.model_settings())
        base = self.subnet_base(n_decode, opts.port) if opts.netns else 0
        servers = []
        for i, (role, k) in enumerate([("decode", k) for k in range(n_decode)] + [("prefill", k) for k in range(n_prefill)]):
            port = opts.port + 1 + 3 * i
            ns, host = self.create_netns(k, base + k) if opts.netns and role == "decode" else (None, "127.0.0.1")
            kv = f"{host}:{port + 1}" if role == "decode" else ""
            argv = [sys.executable, "-m", "chaoskit.reference.pd_server", role, host, str(port),
                    *([str(port + 1)] if kv else []), params]
            p = self.spawn(f"{role}-{k}", [shutil.which("ip") or "/usr/sbin/ip", "netns", "exec", ns, *argv] if ns
                           else argv)
            url = f"http://{host}:{port}"
            servers.append({"name": f"{role}-{k}", "role": role, "pid": p["pid"], "host": host, "port": port,
                            "url": url, "metrics_url": f"{url}/metrics", "kv": kv, "netns": ns})
        for r in servers:
            self.wait_ready(r["name"], lambda r=r: http_status(f"{r['url']}/health") == 200, r["pid"])
            say(f"{r['name']} ready at {r['url']} (pid {r['pid']}" + (f", KV port {r['kv']})" if r["kv"] else ")"))
        return servers

    def _start_gateway(self, opts: RefOptions, replicas: list[dict[str, Any]],
                       say: Callable[[str], None]) -> dict[str, Any]:
        if opts.disaggregated:
            return self._start_pd_gateway(opts, replicas, say)
        triton_engine = opts.engine == "triton"
        completion = completion_probe(opts.engine) if not triton_engine else {}
        cfg = {
            "listen_host": "127.0.0.1", "listen_port": opts.port, "health_mode": opts.health,
            "replicas": [{"name": r["name"], "url": r["url"], "metrics_url": r["metrics_url"]} for r in replicas],
            "health_path": "/v2/health/ready" if triton_engine else "/health",
            "latency_check": ({"method": "POST", "path": "/v2/models/tiny_lm/generate", "body": GENERATE_PROBE}
                              if triton_engine else
                              {"method": "POST", "path": "/v1/completions", "body": completion}),
            "latency_threshold_ms": opts.latency_threshold_ms, **opts.gateway_settings(),
        }
        self._save("gateway.json", cfg)
        p = self.spawn("gateway", [sys.executable, "-m", "chaoskit.reference.gateway", str(self.root / "gateway.json")])
        url = f"http://127.0.0.1:{opts.port}"
        probe = ((f"{url}/v2/models/tiny_lm/generate", GENERATE_PROBE) if triton_engine
                 else (f"{url}/v1/completions", completion))
        self.wait_ready("gateway", lambda: http_status(*probe, timeout=30) == 200, p["pid"])
        say(f"gateway ready at {url} ({opts.health} health checks over {len(replicas)} replicas)")
        return {"url": url, "pid": p["pid"]}

    def _start_pd_gateway(self, opts: RefOptions, servers: list[dict[str, Any]],
                          say: Callable[[str], None]) -> dict[str, Any]:
        """The gateway as the PD router over the decode servers (its replicas) and the prefill servers."""
        one = lambda r: {"name": r["name"], "url": r["url"], "metrics_url": r["metrics_url"], "kv": r["kv"]}  # noqa: E731
        cfg = {"listen_host": "127.0.0.1", "listen_port": opts.port, "health_mode": opts.health,
               "replicas": [one(r) for r in servers if r["role"] == "decode"],
               "prefill": [one(r) for r in servers if r["role"] == "prefill"], "health_path": "/health",
               "latency_check": {"method": "POST", "path": "/v1/completions", "body": PD_PROBE},
               "latency_threshold_ms": opts.latency_threshold_ms, **opts.gateway_settings()}
        self._save("gateway.json", cfg)
        p = self.spawn("gateway", [sys.executable, "-m", "chaoskit.reference.gateway", str(self.root / "gateway.json")])
        url = f"http://127.0.0.1:{opts.port}"
        self.wait_ready("gateway", lambda: http_status(f"{url}/v1/completions", PD_PROBE, timeout=30) == 200, p["pid"])
        say(f"gateway ready at {url} (the PD router over {len(cfg['prefill'])} prefill and {len(cfg['replicas'])} "
            "decode servers)")
        return {"url": url, "pid": p["pid"]}

    def wait_ready(self, name: str, ready: Callable[[], bool], pid: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            if proc_state(pid) in (None, "Z", "X"):  # gone, or a zombie we have not reaped
                raise ChaoskitError(f"{name} exited during start; see {self.logs / (name + '.log')}:\n"
                                    + self.tail(name, 15))
            if time.monotonic() > deadline:
                raise ChaoskitError(f"{name} not ready within {READY_TIMEOUT_S:.0f}s; see {self.logs / (name + '.log')}")
            time.sleep(0.2)

    # ---------------------------------------------------------------- down / status / logs

    def shm_prefix(self, name: str) -> str:
        """The shared-memory region prefix of replica `name`'s python backend: this deployment's and its own."""
        return f"chaoskit_{hashlib.sha256(str(self.root).encode()).hexdigest()[:12]}_{name}_"

    def down(self, say: Callable[[str], None] = print, grace_s: float = 15.0) -> list[str]:
        """Stop exactly the recorded processes (their whole process groups) and delete recorded namespaces. A
        deployment that never came up (no facts: its `up` was killed) gets at most UNREADY_GRACE_S: a tritonserver
        stopped halfway through its start can ignore SIGTERM, and it serves nothing worth draining."""
        if self.facts() is None:
            grace_s = min(grace_s, UNREADY_GRACE_S)
        procs = [(p, ProcessRef.from_json(p)) for p in self.processes()]
        live = [(p, r) for p, r in procs if is_alive(r) or _group_alive(r.pid)]  # orphaned stubs count too
        # the gateway first: a tritonserver waits a second at SIGTERM while it still has HTTP connections open
        # (the gateway's keep-alive ones)
        waves = [[x for x in live if x[0]["name"] == "gateway"], [x for x in live if x[0]["name"] != "gateway"]]
        for wave in waves:
            _stop_groups([r for _, r in wave], grace_s)
        stopped = []
        for p, r in live:
            stopped.append(p["name"])
            say(f"stopped {p['name']} (pid {r.pid})")
        for _ in range(50):
            if not any(_group_alive(r.pid) for _, r in live):
                break
            time.sleep(0.1)
        for p, r in procs:  # what a killed tritonserver left in /dev/shm goes too, once its group is gone
            if p["name"].startswith("triton-") and not _group_alive(r.pid):
                triton.remove_shm(self.shm_prefix(p["name"]))
        from pyroute2 import netns

        for name in self._load("netns.json") or []:
            try:
                netns.remove(name)
                say(f"deleted netns {name}")
            except OSError:
                pass
        from chaoskit.reference import vllm

        shutil.rmtree(vllm.ipc_dir(self.root), ignore_errors=True)  # its replicas' IPC sockets (engine vllm)
        for f in (ref_registry.PROCESSES, ref_registry.FACTS, ref_registry.NETNS):
            (self.root / f).unlink(missing_ok=True)
        ref_registry.unregister(self.root)
        return stopped

    def status(self) -> dict[str, Any]:
        """Each recorded process: alive, and ready: a replica answers a real 1-token request to each model
        (`check` says what failed: a replica whose model process is dead answers e.g. HTTP 400 `Stub process
        'tiny_lm_0_0' is not healthy.`), the gateway its /gateway/status."""
        facts = self.facts() or {}
        urls = {r["name"]: r["url"] for r in facts.get("replicas", [])}
        urls["gateway"] = facts.get("url", "")
        if facts.get("mcp"):
            urls["tiny-mcp"] = facts["mcp"]["url"]
        engine = facts.get("engine", "triton")
        third_party = facts.get("gateway", {}).get("kind", "chaoskit") != "chaoskit"
        procs = self.processes()
        with ThreadPoolExecutor(max(1, len(procs))) as pool:  # a sick replica's check takes seconds
            rows = list(pool.map(lambda p: self._process_status(p, urls.get(p["name"], ""), engine, third_party),
                                 procs))
        return {"dir": str(self.root), "facts": facts, "processes": rows,
                "netns": self._load("netns.json") or []}

    @staticmethod
    def _process_status(p: dict[str, Any], url: str, engine: str, third_party: bool) -> dict[str, Any]:
        alive = is_alive(ProcessRef.from_json(p))
        if not alive:
            ready, check = False, "process not running"
        elif not url and p["name"] != "tap":
            ready, check = False, "no URL in the facts"
        elif p["name"] == "tap":
            ready, check = True, "relaying"
        elif p["name"] == "gateway" and third_party:  # a real 1-token completion through it
            ready, check = check_replica(url, engine)
        elif p["name"] == "gateway":
            answer = http_answer(url + "/gateway/status", timeout=2)
            ready, check = answer.ok, "GET /gateway/status: " + ("answered" if answer.ok else answer.describe())
        elif p["name"] == "tiny-mcp":
            answer = http_answer(url.removesuffix("/mcp") + "/health", timeout=2)
            ready, check = answer.ok, "GET /health: " + ("answered" if answer.ok else answer.describe())
        else:
            ready, check = check_replica(url, engine)
        return {"name": p["name"], "pid": p["pid"], "alive": alive, "ready": ready, "check": check, "url": url,
                "log": p["log"]}

    def tail(self, name: str, lines: int = 50) -> str:
        log = self.logs / f"{name}.log"
        if not log.exists():
            known = ", ".join(sorted(p.stem for p in self.logs.glob("*.log"))) or "none"
            raise ChaoskitError(f"no log for {name!r} in {self.logs} (known: {known})")
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _stop_groups(refs: list[ProcessRef], grace_s: float) -> None:
    """SIGTERM each process group, SIGKILL what is left after `grace_s`. A group whose leader died (a replica
    killed by a poison request) has only orphaned model stubs left, which ignore SIGTERM and have no server to
    unload them: SIGKILL at once."""
    for r in refs:
        try:
            os.killpg(r.pid, signal.SIGTERM if is_alive(r) else signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(r.pid) for r in refs):
        time.sleep(0.05)
    for r in refs:
        if _group_alive(r.pid):
            try:
                os.killpg(r.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def completion_probe(engine: str) -> dict[str, Any]:
    """A 1-token completion to an OpenAI-compatible engine's served model."""
    if engine == "tiny-openai":
        return dict(openai_stack.PROBE)
    from chaoskit.reference.vllm import SERVED_NAME

    return {"model": SERVED_NAME, "prompt": "ready?", "max_tokens": 1}
