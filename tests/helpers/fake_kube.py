"""FakeKubeApi: a FAKE Kubernetes API server (threaded HTTP on 127.0.0.1) with the few endpoints chaoskit uses.

No API server can run on these machines, so this stands in for one; the code under test talks to it through the
real `kubernetes` client, configured by a real kubeconfig file (`write_kubeconfig`). Objects live in memory as
the JSON the API returns. What it does NOT do (a real cluster does): graceful deletion is immediate (the grace
period is only recorded), no watch, no admission, no scheduling; only equality label selectors and merge
patches (a JSON patch or strategic merge patch is answered 415, like a server that does not accept that type).
A pod created here stays Pending unless a `kubelet` callback runs it (tests give one that runs the agent as a
process: the pod is Running while it runs, its log grows as it prints, deleting the pod sends it SIGTERM).
`add_rollout_deployment` adds a Deployment whose pods the fake makes and replaces when its template changes: a
DOUBLE of the Deployment controller (see its docstring). `serve_tls` adds an HTTPS listener (a self-signed certificate for 127.0.0.1, made with openssl), so that a pod run
by `InClusterKubelet` reaches this server through the client's real in-cluster config; `refuse` makes the
matching requests answer an error.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]
Kubelet = Callable[[Obj], "tuple[str, str] | subprocess.Popen[str]"]  # pod -> (final phase, log), or its process

CORE = r"/api/v1/namespaces/(?P<ns>[^/]+)"
APPS = r"/apis/apps/v1/namespaces/(?P<ns>[^/]+)"
ROUTES: list[tuple[str, str, str]] = [  # (method, path pattern, handler name)
    ("GET", CORE + r"/pods", "list_pods"),
    ("POST", CORE + r"/pods", "create_pod"),
    ("GET", CORE + r"/pods/(?P<name>[^/]+)", "get_pod"),
    ("DELETE", CORE + r"/pods/(?P<name>[^/]+)", "delete_pod"),
    ("GET", CORE + r"/pods/(?P<name>[^/]+)/log", "pod_log"),
    ("GET", CORE + r"/configmaps", "list_configmaps"),
    ("POST", CORE + r"/configmaps", "create_configmap"),
    ("GET", CORE + r"/configmaps/(?P<name>[^/]+)", "get_configmap"),
    ("PATCH", CORE + r"/configmaps/(?P<name>[^/]+)", "patch_configmap"),
    ("DELETE", CORE + r"/configmaps/(?P<name>[^/]+)", "delete_configmap"),
    ("POST", CORE + r"/secrets", "create_secret"),
    ("GET", CORE + r"/secrets/(?P<name>[^/]+)", "get_secret"),
    ("GET", CORE + r"/events", "list_events"),
    ("GET", APPS + r"/deployments/(?P<name>[^/]+)/scale", "get_scale"),
    ("GET", r"/api/v1/nodes", "list_nodes"),
    ("GET", r"/api/v1/nodes/(?P<name>[^/]+)", "get_node"),
    ("GET", r"/api/v1/pods", "list_all_pods"),
    ("GET", r"/apis/resource.k8s.io/v1/resourceslices", "list_resourceslices"),
    ("PATCH", APPS + r"/deployments/(?P<name>[^/]+)/scale", "patch_scale"),
    ("GET", APPS + r"/deployments/(?P<name>[^/]+)", "get_deployment"),
    ("PATCH", APPS + r"/deployments/(?P<name>[^/]+)", "patch_deployment"),
]
TOKEN = "fake-kube-token"


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": self.reason, "code": self.code}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str
    authorization: str


@dataclass
class FakeState:
    pods: dict[tuple[str, str], Obj] = field(default_factory=dict)
    configmaps: dict[tuple[str, str], Obj] = field(default_factory=dict)
    deployments: dict[tuple[str, str], Obj] = field(default_factory=dict)
    workloads: dict[tuple[str, str], Obj] = field(default_factory=dict)  # whole Deployment objects (add_deployment_spec)
    events: list[Obj] = field(default_factory=list)
    logs: dict[tuple[str, str], str] = field(default_factory=dict)
    deleted: list[tuple[str, str, int | None]] = field(default_factory=list)  # (namespace, pod, grace period)
    nodes: dict[str, Obj] = field(default_factory=dict)
    resourceslices: list[Obj] | None = None  # None: the cluster serves no DRA API (404)
    secrets: dict[tuple[str, str], Obj] = field(default_factory=dict)  # data values base64, as the API has them


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, sep, value = term.partition("=")
        if not sep or key.endswith("!"):
            raise ApiError(400, "BadRequest", f"the fake only supports equality selectors, got '{term}'")
        if labels.get(key) != value.lstrip("="):
            return False
    return True


def _not_found(kind: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind} "{name}" not found')


class FakeKubeApi:
    """Start with `with FakeKubeApi() as api:`; seed objects with add_pod / add_deployment / add_event."""

    def __init__(self) -> None:
        self.state = FakeState()
        self.requests: list[Request] = []
        self.kubelet: Kubelet | None = None
        self.recreate_deleted = False  # act like a ReplicaSet: a deleted seeded pod is replaced by a new one
        self.seeded: set[tuple[str, str]] = set()  # pods made by add_pod (with a controller), not by the API
        self.keep_container_ids = False  # ... whose containers are the old one's (stand-ins that cannot restart)
        self._lock = threading.RLock()
        self._serial = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)  # shutdown at exit waits one poll: 50 ms, not 0.5 s
        self._kubelets: list[threading.Thread] = []
        self._procs: dict[tuple[str, str], subprocess.Popen[str]] = {}  # pods whose containers run as processes
        self._tls: ThreadingHTTPServer | None = None
        self._tls_ca = Path()
        self.refused: list[tuple[str, str, int]] = []  # (method, path regex, status): answered with that error
        self.tokens: dict[str, str] = {}  # service account tokens a kubelet minted -> NAMESPACE/SERVICEACCOUNT
        # the Deployment controller double (add_rollout_deployment): how long a rollout takes, the images it can
        # never pull (a rollout to a template naming one never finishes), and what starts a new pod's containers
        # (pod -> their containerIDs; default: made-up IDs, no process)
        self.rollout_s = 0.3
        self.stuck_images: set[str] = set()
        self.start_containers: Callable[[Obj], tuple[str, ...]] | None = None
        self.controlled: dict[tuple[str, str], str] = {}  # Deployments it runs -> node of their pods

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in list(self._procs.values()):  # a pod still running when the test ends is killed
            proc.kill()
        for t in self._kubelets:
            t.join(timeout=30)
        for server in (self._server, self._tls):
            if server is not None:
                server.shutdown()
                server.server_close()
        self._thread.join(timeout=5)

    def serve_tls(self, workdir: Path) -> tuple[int, Path]:
        """Also serve the API over HTTPS on 127.0.0.1 (what the in-cluster config insists on): its port, and the
        CA file that verifies it (the certificate itself, self-signed for IP 127.0.0.1, valid one day)."""
        with self._lock:  # two pods started at once: one listener
            return self._serve_tls(workdir)

    def _serve_tls(self, workdir: Path) -> tuple[int, Path]:
        """serve_tls, under the lock: the listener started once."""
        if self._tls is None:
            cert, key = workdir / "fake-kube-tls.crt", workdir / "fake-kube-tls.key"
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                            "-nodes", "-days", "1", "-subj", "/CN=fake-kube", "-addext", "subjectAltName=IP:127.0.0.1",
                            "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=30)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self._tls = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
            self._tls.daemon_threads = True
            self._tls.socket = ctx.wrap_socket(self._tls.socket, server_side=True)
            self._tls_ca = cert
            threading.Thread(target=self._tls.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self._tls.server_address[1], self._tls_ca

    def refuse(self, method: str, path: str, status: int) -> None:
        """Answer every `method` request whose path matches the regex `path` with `status` (403, 500, ...)."""
        with self._lock:
            self.refused.append((method, path, status))

    def write_kubeconfig(self, path: Path, context: str = "fake") -> Path:
        """A real kubeconfig (cluster, user with a token, context) pointing at this server."""
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": context,
               "clusters": [{"name": "fake-cluster", "cluster": {"server": self.url}}],
               "users": [{"name": "fake-user", "user": {"token": TOKEN}}],
               "contexts": [{"name": context, "context": {"cluster": "fake-cluster", "user": "fake-user"}}]}
        path.write_text(yaml.safe_dump(cfg))
        return path

    # -- seeding ------------------------------------------------------------------------------------------
    def add_pod(self, namespace: str, name: str, labels: dict[str, str], node: str = "node-a",
                phase: str = "Running", containers: tuple[str, ...] = ("app",), ready: bool = True,
                restarts: int = 0, container_ids: tuple[str, ...] | None = None, gpus: int = 0) -> Obj:
        n = next(self._serial)
        ids = container_ids or tuple(f"containerd://{n:04d}{i:04d}{c}" for i, c in enumerate(containers))
        statuses = [{"name": c, "ready": ready, "restartCount": restarts, "image": f"{c}:1", "imageID": "",
                     "containerID": ids[i], "started": phase == "Running"} for i, c in enumerate(containers)]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": dict(labels),
                            "resourceVersion": str(n)},
               "spec": {"nodeName": node, "containers": [
                   {"name": c, "image": f"{c}:1", **({"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}
                                                     if gpus and i == 0 else {})} for i, c in enumerate(containers)]},
               "status": {"phase": phase, "containerStatuses": statuses,
                          "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
        with self._lock:
            self.state.pods[(namespace, name)] = pod
            self.seeded.add((namespace, name))
        return pod

    def add_node(self, name: str, labels: dict[str, str] | None = None, gpus: int = 0, ready: bool = True) -> Obj:
        """A node with a Ready condition and `gpus` allocatable nvidia.com/gpu; tests change it in state.nodes."""
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": dict(labels or {}), "uid": str(uuid.uuid4()),
                             "resourceVersion": str(next(self._serial))},
                "spec": {}, "status": {
                    "allocatable": {"cpu": "8", **({"nvidia.com/gpu": str(gpus)} if gpus else {})},
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                    "lastTransitionTime": "2026-12-01T00:00:00Z", "reason": "KubeletReady"}]}}
        with self._lock:
            self.state.nodes[name] = node
        return node

    def add_deployment(self, namespace: str, name: str, replicas: int) -> None:
        with self._lock:
            self.state.deployments[(namespace, name)] = {"replicas": replicas}

    def add_deployment_spec(self, namespace: str, name: str, pod_spec: Obj, replicas: int = 1) -> Obj:
        """A whole Deployment object (GET / merge PATCH of deployments), its template's pod spec as given. The
        fake runs no controller: a patched template starts no rollout."""
        labels = {"app": name}
        obj = {"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "generation": 1,
                            "resourceVersion": str(next(self._serial))},
               "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                        "template": {"metadata": {"labels": labels}, "spec": json.loads(json.dumps(pod_spec))}}}
        with self._lock:
            self.state.workloads[(namespace, name)] = obj
        return obj

    def add_rollout_deployment(self, namespace: str, name: str, pod_spec: Obj, replicas: int = 1,
                               node: str = "node-a") -> Obj:
        """add_deployment_spec, with a DOUBLE of the Deployment controller: its pods (on `node`) are made here,
        owned by ReplicaSet NAME-HASH (HASH their pod-template-hash label, from the template), Running and ready.
        A change of the template bumps the generation (as the API server does) and starts a rollout: status
        observedGeneration follows at once, 0 updated; after rollout_s the old pods are deleted, new ones made
        from the new template (start_containers gives their containerIDs) and the status says every replica is
        updated and ready. A template naming an image in stuck_images never finishes (image pull back-off: the
        old pods stay). No surge, no ReplicaSet objects, no gradual replacement."""
        obj = self.add_deployment_spec(namespace, name, pod_spec, replicas)
        with self._lock:
            self.controlled[(namespace, name)] = node
            self._replace_pods(namespace, name, obj["metadata"]["generation"])
        return obj

    def _pods_of(self, namespace: str, name: str) -> list[tuple[str, str]]:
        return [k for k, pod in self.state.pods.items() if k[0] == namespace and any(
            o.get("kind") == "ReplicaSet" and o["name"].startswith(f"{name}-")
            for o in pod["metadata"].get("ownerReferences", []))]

    def _start_rollout(self, namespace: str, name: str) -> None:
        """The controller saw a new template: observedGeneration now, the pods replaced after rollout_s."""
        d = self.state.workloads[(namespace, name)]
        generation = d["metadata"]["generation"]
        d["status"] = {**d.get("status", {}), "observedGeneration": generation, "updatedReplicas": 0}
        spec = d["spec"]["template"]["spec"]
        images = {c.get("image") for c in [*spec.get("containers", []), *spec.get("initContainers", [])]}
        if images & self.stuck_images:
            return
        timer = threading.Timer(self.rollout_s, self._finish_rollout, (namespace, name, generation))
        timer.daemon = True
        timer.start()

    def _finish_rollout(self, namespace: str, name: str, generation: int) -> None:
        with self._lock:
            d = self.state.workloads.get((namespace, name))
            if d is not None and d["metadata"]["generation"] == generation:  # else a newer rollout took over
                self._replace_pods(namespace, name, generation)

    def _replace_pods(self, namespace: str, name: str, generation: int) -> None:
        """The Deployment's pods replaced by new ones of its template, its status a finished rollout."""
        d = self.state.workloads[(namespace, name)]
        for key in self._pods_of(namespace, name):
            del self.state.pods[key]
            self.state.deleted.append((*key, None))
        template = d["spec"]["template"]
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        replicas = d["spec"].get("replicas", 1)
        for _ in range(replicas):
            pod_name = f"{name}-{digest}-{uuid.uuid4().hex[:5]}"
            pod = self.add_pod(namespace, pod_name, {**template["metadata"]["labels"], "pod-template-hash": digest},
                               node=self.controlled[(namespace, name)],
                               containers=tuple(c["name"] for c in template["spec"]["containers"]))
            self.seeded.discard((namespace, pod_name))
            pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True,
                                                   "name": f"{name}-{digest}", "uid": str(uuid.uuid4())}]
            pod["spec"] = {**json.loads(json.dumps(template["spec"])), "nodeName": pod["spec"]["nodeName"]}
            if self.start_containers is not None:
                ids = self.start_containers(pod)
                for status, cid in zip(pod["status"]["containerStatuses"], ids, strict=True):
                    status["containerID"] = cid
        d["status"] = {"observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
                       "readyReplicas": replicas, "availableReplicas": replicas}

    def add_event(self, namespace: str, pod: str, reason: str, count: int = 1, type_: str = "Warning") -> None:
        n = next(self._serial)
        with self._lock:
            self.state.events.append({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{pod}.{n:x}", "namespace": namespace},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace},
                "reason": reason, "type": type_, "count": count, "message": f"{reason} on {pod}"})

    def replicas(self, namespace: str, name: str) -> int:
        return self.state.deployments[(namespace, name)]["replicas"]

    def calls(self, method: str, pattern: str = "") -> list[Request]:
        return [r for r in self.requests if r.method == method and re.search(pattern, r.path)]

    # -- handlers: (params, query, body) -> (status, JSON object or text) ----------------------------------
    def list_pods(self, p: dict, q: dict, body: Any) -> Obj:
        sel = q.get("labelSelector", "")
        items = [pod for (ns, _), pod in sorted(self.state.pods.items())
                 if ns == p["ns"] and _matches(pod["metadata"].get("labels", {}), sel)]
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}

    def list_all_pods(self, p: dict, q: dict, body: Any) -> Obj:
        """Every namespace's pods; fieldSelector spec.nodeName=NODE only (what kube.nodes asks)."""
        field_sel = q.get("fieldSelector", "")
        node = field_sel.removeprefix("spec.nodeName=") if field_sel.startswith("spec.nodeName=") else None
        if field_sel and node is None:
            raise ApiError(400, "BadRequest", f"the fake only supports fieldSelector spec.nodeName=, got {field_sel}")
        items = [pod for _, pod in sorted(self.state.pods.items())
                 if node is None or pod["spec"].get("nodeName") == node]
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}

    def list_nodes(self, p: dict, q: dict, body: Any) -> Obj:
        sel = q.get("labelSelector", "")
        items = [n for _, n in sorted(self.state.nodes.items()) if _matches(n["metadata"].get("labels", {}), sel)]
        return {"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "1"}, "items": items}

    def get_node(self, p: dict, q: dict, body: Any) -> Obj:
        node = self.state.nodes.get(p["name"])
        if node is None:
            raise _not_found("nodes", p["name"])
        return node

    def list_resourceslices(self, p: dict, q: dict, body: Any) -> Obj:
        if self.state.resourceslices is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {},
                "items": self.state.resourceslices}

    def get_pod(self, p: dict, q: dict, body: Any) -> Obj:
        pod = self.state.pods.get((p["ns"], p["name"]))
        if pod is None:
            raise _not_found("pods", p["name"])
        return pod

    def create_pod(self, p: dict, q: dict, body: Any) -> Obj:
        meta = body.setdefault("metadata", {})
        key = (p["ns"], meta.get("name", ""))
        if key in self.state.pods:
            raise ApiError(409, "AlreadyExists", f'pods "{key[1]}" already exists')
        meta.update(namespace=p["ns"], uid=str(uuid.uuid4()), resourceVersion=str(next(self._serial)))
        body["status"] = {"phase": "Pending"}
        self.state.pods[key] = body
        if self.kubelet is not None:
            t = threading.Thread(target=self._run_kubelet, args=(key, json.loads(json.dumps(body))), daemon=True)
            self._kubelets.append(t)
            t.start()
        return body

    def _run_kubelet(self, key: tuple[str, str], pod: Obj) -> None:
        assert self.kubelet is not None
        try:
            result = self.kubelet(pod)
            phase, log = result if isinstance(result, tuple) else self._follow(key, result)
        except Exception as e:  # a broken kubelet callback is a Failed pod, as a crashing container would be
            phase, log = "Failed", f"kubelet: {type(e).__name__}: {e}"
        with self._lock:
            self.state.logs[key] = log
            if key in self.state.pods:
                self.state.pods[key]["status"] = {"phase": phase}

    def _follow(self, key: tuple[str, str], proc: subprocess.Popen[str]) -> tuple[str, str]:
        """A container running as a process: Running, its log growing line by line, until it exits."""
        with self._lock:
            self._procs[key] = proc
            if key in self.state.pods:
                self.state.pods[key]["status"] = {"phase": "Running"}
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._lock:
                self.state.logs[key] = self.state.logs.get(key, "") + line
        code = proc.wait()
        with self._lock:
            self._procs.pop(key, None)
            return ("Succeeded" if code == 0 else "Failed"), self.state.logs.get(key, "")

    def delete_pod(self, p: dict, q: dict, body: Any) -> Obj:
        pod = self.get_pod(p, q, body)
        want_uid = ((body or {}).get("preconditions") or {}).get("uid")
        if want_uid and want_uid != pod["metadata"]["uid"]:
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {want_uid}, UID in object "
                                            f"meta: {pod['metadata']['uid']}")
        grace = q.get("gracePeriodSeconds", (body or {}).get("gracePeriodSeconds"))
        del self.state.pods[(p["ns"], p["name"])]
        self.state.deleted.append((p["ns"], p["name"], None if grace is None else int(grace)))
        proc = self._procs.get((p["ns"], p["name"]))
        if proc is not None:  # the kubelet stops a running container: SIGTERM (the grace period is not waited)
            proc.terminate()
        if self.recreate_deleted and (p["ns"], p["name"]) in self.seeded:
            spec = pod["spec"]
            ids = tuple(s["containerID"] for s in pod["status"].get("containerStatuses", []))
            self.add_pod(p["ns"], f"{p['name']}-r{next(self._serial)}", pod["metadata"].get("labels", {}),
                         node=spec.get("nodeName", "node-a"), containers=tuple(c["name"] for c in spec["containers"]),
                         container_ids=self.keep_container_ids and ids or None)
        return pod

    def pod_log(self, p: dict, q: dict, body: Any) -> str:
        self.get_pod(p, q, body)
        return self.state.logs.get((p["ns"], p["name"]), "")

    def list_configmaps(self, p: dict, q: dict, body: Any) -> Obj:
        sel = q.get("labelSelector", "")
        items = [cm for (ns, _), cm in sorted(self.state.configmaps.items())
                 if ns == p["ns"] and _matches(cm["metadata"].get("labels", {}), sel)]
        return {"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "1"}, "items": items}

    def create_configmap(self, p: dict, q: dict, body: Any) -> Obj:
        meta = body.setdefault("metadata", {})
        key = (p["ns"], meta.get("name", ""))
        if key in self.state.configmaps:
            raise ApiError(409, "AlreadyExists", f'configmaps "{key[1]}" already exists')
        meta.update(namespace=p["ns"], uid=str(uuid.uuid4()), resourceVersion=str(next(self._serial)))
        self.state.configmaps[key] = body
        return body

    def get_configmap(self, p: dict, q: dict, body: Any) -> Obj:
        cm = self.state.configmaps.get((p["ns"], p["name"]))
        if cm is None:
            raise _not_found("configmaps", p["name"])
        return cm

    def patch_configmap(self, p: dict, q: dict, body: Any) -> Obj:
        cm = self.get_configmap(p, q, body)
        _merge(cm, body)
        cm["metadata"]["resourceVersion"] = str(next(self._serial))
        return cm

    def delete_configmap(self, p: dict, q: dict, body: Any) -> Obj:
        cm = self.get_configmap(p, q, body)
        want_rv = ((body or {}).get("preconditions") or {}).get("resourceVersion")
        if want_rv and want_rv != cm["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f"Precondition failed: ResourceVersion in precondition: {want_rv}, "
                                            f"ResourceVersion in object meta: {cm['metadata']['resourceVersion']}")
        del self.state.configmaps[(p["ns"], p["name"])]
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}

    def create_secret(self, p: dict, q: dict, body: Any) -> Obj:
        meta = body.setdefault("metadata", {})
        key = (p["ns"], meta.get("name", ""))
        if key in self.state.secrets:
            raise ApiError(409, "AlreadyExists", f'secrets "{key[1]}" already exists')
        meta.update(namespace=p["ns"], uid=str(uuid.uuid4()), resourceVersion=str(next(self._serial)))
        self.state.secrets[key] = body
        return body

    def get_secret(self, p: dict, q: dict, body: Any) -> Obj:
        secret = self.state.secrets.get((p["ns"], p["name"]))
        if secret is None:
            raise _not_found("secrets", p["name"])
        return secret

    def list_events(self, p: dict, q: dict, body: Any) -> Obj:
        items = [e for e in self.state.events if e["metadata"]["namespace"] == p["ns"]]
        return {"apiVersion": "v1", "kind": "EventList", "metadata": {"resourceVersion": "1"}, "items": items}

    def get_scale(self, p: dict, q: dict, body: Any) -> Obj:
        d = self.state.deployments.get((p["ns"], p["name"]))
        if d is None:
            raise _not_found("deployments.apps", p["name"])
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": p["name"], "namespace": p["ns"]},
                "spec": {"replicas": d["replicas"]}, "status": {"replicas": d["replicas"]}}

    def patch_scale(self, p: dict, q: dict, body: Any) -> Obj:
        self.get_scale(p, q, body)
        replicas = ((body or {}).get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}")
        self.state.deployments[(p["ns"], p["name"])]["replicas"] = replicas
        return self.get_scale(p, q, body)

    def get_deployment(self, p: dict, q: dict, body: Any) -> Obj:
        d = self.state.workloads.get((p["ns"], p["name"]))
        if d is None:
            raise _not_found("deployments.apps", p["name"])
        return d

    def patch_deployment(self, p: dict, q: dict, body: Any) -> Obj:
        d = self.get_deployment(p, q, body)
        before = json.dumps(d["spec"], sort_keys=True)
        _merge(d, body)
        d["metadata"]["resourceVersion"] = str(next(self._serial))
        if json.dumps(d["spec"], sort_keys=True) != before:
            d["metadata"]["generation"] += 1
            if (p["ns"], p["name"]) in self.controlled:
                self._start_rollout(p["ns"], p["name"])
        return d

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, content_type: str) -> tuple[int, Any]:
        if method == "PATCH" and not content_type.startswith("application/merge-patch+json"):
            raise ApiError(415, "UnsupportedMediaType", f"the fake accepts merge patches only, got {content_type}")
        for verb, pattern, status in self.refused:
            if verb == method and re.search(pattern, path):
                raise ApiError(status, HTTPStatus(status).phrase.replace(" ", ""), f"refused by the test ({status})")
        for verb, pattern, name in ROUTES:
            m = re.fullmatch(pattern, path)
            if verb == method and m:
                with self._lock:
                    return (201 if method == "POST" else 200), getattr(self, name)(m.groupdict(), query, body)
        raise ApiError(404, "NotFound", f"the fake has no {method} {path}")


HELPER_RUN = "20261203-1200-kube-Helper_Test"  # a run id that is not a DNS label as it stands


def helper_placement(cluster: Any, **kw: Any) -> Any:
    """A k8s-helper placement for one fault on node-7 of the fake cluster (a targets.kube.ClusterRef), run
    HELPER_RUN, key k1."""
    from chaoskit.executors.k8s_helper import HelperPlacement

    return HelperPlacement(cluster=cluster.to_json(), node="node-7", run_id=HELPER_RUN,
                           image="registry.local/chaoskit:0.9", key="k1", **kw)


def run_pod_here(pod: Obj, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A FAKE kubelet for helper pods: what a node would run, run on this host — the pod's command (the real
    `python -m chaoskit.agent`) with its environment (or `env`), as a process whose output is the pod's log. It
    gives no way to the API server (see InClusterKubelet)."""
    (c,) = pod["spec"]["containers"]
    assert c["command"][:3] == ["python", "-m", "chaoskit.agent"]
    env = {**os.environ, **(env if env is not None else {e["name"]: e["value"] for e in c["env"]})}
    return subprocess.Popen([sys.executable, *c["command"][1:]], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@dataclass
class InClusterKubelet:
    """A FAKE kubelet like run_pod_here that also gives the pod what a node gives it to reach the API server:
    KUBERNETES_SERVICE_HOST/PORT (the fake's HTTPS listener, serve_tls) and its projected volumes (a token of the
    pod's ServiceAccount, recorded in api.tokens; the cluster's CA as ConfigMap kube-root-ca.crt), written to a
    directory of this host per pod. There is no mount namespace here, so an env value naming a volume's mount path
    (or a path under it) names that directory instead; other volumes are not provided."""

    api: FakeKubeApi
    workdir: Path

    def __call__(self, pod: Obj) -> subprocess.Popen[str]:
        port, ca = self.api.serve_tls(self.workdir)
        (c,) = pod["spec"]["containers"]
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        here = {}
        for vol in pod["spec"].get("volumes", []):
            if "projected" in vol and vol["name"] in mounts:
                here[mounts[vol["name"]]] = self._project(pod, vol, ca)
        env = {e["name"]: _moved(e["value"], here) for e in c["env"]}
        return run_pod_here(pod, {**env, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)})

    def _project(self, pod: Obj, vol: Obj, ca: Path) -> Path:
        """The projected volume's files in a directory of its own: a fresh token, ca.crt."""
        meta = pod["metadata"]
        d = self.workdir / f"{meta['name']}-{vol['name']}"
        d.mkdir(parents=True)
        for src in vol["projected"]["sources"]:
            if "serviceAccountToken" in src:
                token = f"fake-sa-token-{uuid.uuid4().hex}"
                self.api.tokens[token] = f"{meta['namespace']}/{pod['spec'].get('serviceAccountName', 'default')}"
                (d / src["serviceAccountToken"]["path"]).write_text(token)
            elif src.get("configMap", {}).get("name") == "kube-root-ca.crt":
                for item in src["configMap"]["items"]:
                    (d / item["path"]).write_text(ca.read_text())
            else:
                raise ValueError(f"the fake kubelet cannot project {src}")
        return d


def _moved(value: str, mounts: dict[str, Path]) -> str:
    """An env value naming a mount path (or under it) names the directory standing in for that mount."""
    for path, d in mounts.items():
        if value == path or value.startswith(path.rstrip("/") + "/"):
            return str(d) + value[len(path):]
    return value


def _merge(target: Obj, patch: Obj) -> None:
    """RFC 7386 merge patch: null deletes a key, maps merge, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _handler_for(api: FakeKubeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw) if raw else None
            ctype = self.headers.get("Content-Type", "")
            api.requests.append(Request(self.command, parts.path, query, body, ctype,
                                        self.headers.get("Authorization", "")))
            try:
                code, out = api.handle(self.command, parts.path, query, body, ctype)
            except ApiError as e:
                code, out = e.code, e.status()
            data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(out, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

    return Handler
