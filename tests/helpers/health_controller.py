"""TEST DOUBLE: a simulated GPU health controller for the FAKE API server (fake_kube.py), standing in for what
NVSentinel, the DRA GPU driver or node-problem-detector do on a real cluster (no cluster here).

It tails this host's real kernel log (/dev/kmsg) for the NVIDIA driver's XID lines. For a critical XID on the GPU
of a node it watches, it reacts in stages as those components do: a node condition and a taint (detect), cordon,
eviction of the node's GPU pods, which a stand-in scheduler recreates Ready on another node (drain, reschedule),
then, after `remediate_s`, clears the condition and taint and uncordons (recover). `react=False` is the silent
pipeline: it reads the same lines and does nothing."""

from __future__ import annotations

import copy
import re
import threading
import time
from datetime import UTC, datetime

from chaoskit.probes.kernel_log import KmsgTail
from tests.helpers.fake_kube import FakeKubeApi

XID_LINE = re.compile(r"NVRM: Xid \(PCI:(?P<bus>[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2})\): (?P<xid>\d+),")
CRITICAL = {48, 79, 94, 95, 119}
CONDITION, TAINT = "GpuXidError", "nvidia.com/gpu-xid"


class HealthController:
    def __init__(self, api: FakeKubeApi, gpus: dict[str, str], spare: str, react: bool = True,
                 step_s: float = 0.2, remediate_s: float = 2.5):
        self.api, self.gpus, self.spare, self.react = api, gpus, spare, react  # gpus: printed bus id -> node
        self.step_s, self.remediate_s = step_s, remediate_s
        self.seen: list[tuple[float, str, int]] = []  # (when, node, xid)
        self._stop = threading.Event()
        self._tail = KmsgTail()
        self._tail.open()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthController:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._tail.close()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for _, text in self._tail.read():
                m = XID_LINE.search(text)
                node = self.gpus.get(m["bus"]) if m else None
                if m and node and int(m["xid"]) in CRITICAL:
                    self.seen.append((time.time(), node, int(m["xid"])))
                    if self.react:
                        self._react(node)

    def _react(self, node: str) -> None:
        for stage in (self._detect, self._cordon, self._drain):
            if self._stop.wait(self.step_s):
                return
            with self.api._lock:
                stage(node)
        if not self._stop.wait(self.remediate_s):
            with self.api._lock:
                self._recover(node)

    def _node(self, node: str) -> dict:
        return self.api.state.nodes[node]

    def _detect(self, node: str) -> None:
        n = self._node(node)
        n["status"]["conditions"].append({"type": CONDITION, "status": "True", "reason": "XidCritical",
                                          "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})
        n["spec"]["taints"] = [*n["spec"].get("taints", []), {"key": TAINT, "effect": "NoSchedule"}]

    def _cordon(self, node: str) -> None:
        self._node(node)["spec"]["unschedulable"] = True

    def _drain(self, node: str) -> None:
        """Evict the node's GPU pods; the stand-in scheduler puts each one, renamed, Ready on the spare node."""
        pods = self.api.state.pods
        for key, pod in [(k, p) for k, p in pods.items() if p["spec"].get("nodeName") == node]:
            if any("nvidia.com/gpu" in ((c.get("resources") or {}).get("requests") or {})
                   for c in pod["spec"]["containers"]):
                del pods[key]
                moved = copy.deepcopy(pod)
                moved["metadata"]["name"] = key[1] + "-r"
                moved["spec"]["nodeName"] = self.spare
                pods[(key[0], key[1] + "-r")] = moved

    def _recover(self, node: str) -> None:
        n = self._node(node)
        n["status"]["conditions"] = [c for c in n["status"]["conditions"] if c["type"] != CONDITION]
        n["spec"]["taints"] = [t for t in n["spec"].get("taints", []) if t["key"] != TAINT]
        n["spec"]["unschedulable"] = False
