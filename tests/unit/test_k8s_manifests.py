"""deploy/k8s: every manifest loads, has the fields the API server requires, and the kustomize wiring holds
(no Kubernetes API server or kustomize binary exists here; this checks what can be checked offline)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from chaoskit.reference.gateway import GatewayConfig

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
WORKLOADS = ("Deployment", "StatefulSet")


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def resources(kfile: Path) -> list[dict]:
    """Every document a kustomization pulls in (recursively through bases)."""
    k = docs(kfile)[0]
    out = []
    for r in k.get("resources", []):
        p = (kfile.parent / r).resolve()
        out += resources(p / "kustomization.yaml") if p.is_dir() else docs(p)
    return out


def test_there_are_manifests_and_overlays():
    assert (K8S / "base" / "kustomization.yaml").exists()
    assert {p.parent.name for p in kustomizations()} >= {"base", "vllm", "latency-health"}


@pytest.mark.parametrize("path", sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml"),
                         ids=lambda p: str(p.relative_to(K8S)))
def test_each_manifest_has_required_fields(path):
    for d in docs(path):
        assert d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), path
        if d["kind"] in WORKLOADS:
            spec = d["spec"]
            labels = spec["template"]["metadata"]["labels"]
            assert spec["selector"]["matchLabels"].items() <= labels.items(), "selector must match the template"
            for c in spec["template"]["spec"]["containers"]:
                assert c["name"] and c["image"] and c.get("ports") and c.get("readinessProbe")
                assert c.get("resources", {}).get("limits", {}).get("memory"), f"{c['name']}: no memory limit"
        if d["kind"] == "Service":
            assert d["spec"]["selector"] and d["spec"]["ports"]


@pytest.mark.parametrize("kfile", kustomizations(), ids=lambda p: p.parent.name)
def test_kustomization_wiring(kfile):
    k = docs(kfile)[0]
    assert k["kind"] == "Kustomization"
    for r in k.get("resources", []):
        assert (kfile.parent / r).exists(), f"{kfile}: missing resource {r}"
    everything = resources(kfile)
    names = {(d["kind"], d["metadata"]["name"]) for d in everything}
    for patch in k.get("patches", []):
        if "path" in patch:
            for d in docs(kfile.parent / patch["path"]):
                assert (d["kind"], d["metadata"]["name"]) in names, f"patch target {d['kind']}/{d['metadata']['name']}"
        else:
            t = patch["target"]
            assert (t["kind"], t["name"]) in names
            target = next(d for d in everything if (d["kind"], d["metadata"]["name"]) == (t["kind"], t["name"]))
            for op in yaml.safe_load(patch["patch"]):
                node = target
                for part in op["path"].strip("/").split("/")[:-1]:
                    node = node[int(part)] if isinstance(node, list) else node[part]
                assert op["path"].rsplit("/", 1)[1] in node, f"{op['path']} not in {t['name']}"


def _gateway_configs() -> list[tuple[Path, dict]]:
    out = []
    for path in K8S.rglob("*.yaml"):
        for d in docs(path):
            if d.get("kind") == "ConfigMap" and "gateway.json" in d.get("data", {}):
                out.append((path, json.loads(d["data"]["gateway.json"])))
    return out


def test_gateway_configs_are_valid_and_point_at_real_replicas():
    known = {f.name for f in fields(GatewayConfig)}
    configs = _gateway_configs()
    assert len(configs) == 3
    for path, cfg in configs:
        assert set(cfg) <= known, f"{path}: unknown keys {set(cfg) - known}"
        GatewayConfig(**cfg)
        overlay = path.parent
        sts = {d["metadata"]["name"]: d for p in overlay.glob("*.yaml") for d in docs(p)
               if d.get("kind") == "StatefulSet"}
        sts.update({d["metadata"]["name"]: d for d in resources(K8S / "base" / "kustomization.yaml")
                    if d["kind"] == "StatefulSet"})
        for r in cfg["replicas"]:
            host = r["url"].split("//")[1].split(":")[0]  # triton-0.triton
            pod, service = host.split(".")
            name, ordinal = pod.rsplit("-", 1)
            assert name in sts and sts[name]["spec"]["serviceName"] == service
            assert int(ordinal) < sts[name]["spec"]["replicas"]


def test_engines_ask_for_a_gpu():
    for path in K8S.rglob("*statefulset.yaml"):
        for d in docs(path):
            for c in d["spec"]["template"]["spec"]["containers"]:
                assert c["resources"]["limits"].get("nvidia.com/gpu") == 1, path
