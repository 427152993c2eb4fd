"""A helper process imports only what it runs: each fault's declared `helper` module, loaded the way helper_proc
runs it (as its file, `python -S -P`), pulls in no fault family, no experiment model and no heavy library."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chaoskit.injectors import INJECTORS
from chaoskit.injectors.forkserver import main as proxy_fork
from chaoskit.injectors.helper_proc import command, env

HEAVY = ("pydantic", "aiohttp", "yaml", "rich", "typer", "kubernetes", "numpy", "psutil", "pyroute2")
# standard library only: they need nothing of chaoskit (a memory holder's own size matters to the OOM killer)
STANDALONE = {"chaoskit.injectors.proxy.helper", "chaoskit.injectors.memory.holder",
              "chaoskit.injectors.memory.limit_helper", "chaoskit.injectors.cpu.stress_helper"}
# load.flood's helper is chaoskit's load generator (pydantic LoadSpec, numpy histograms): it runs all of it
RUNS_HEAVY = {"chaoskit.injectors.flood.helper"}
HELPERS = sorted({cls.helper for cls in INJECTORS if cls.helper})
SERVERS = sorted({cls.server for cls in INJECTORS if hasattr(cls, "server")})  # what proxy_proc runs

LOAD = """
import importlib.util, json, sys
before = set(sys.modules)
spec = importlib.util.spec_from_file_location("helper", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def imported_by(module: str) -> set[str]:
    *python, path = command(module)
    out = subprocess.run([*python, "-c", LOAD, path], env=env(), capture_output=True, text=True, timeout=60,
                         check=True)
    return set(json.loads(out.stdout))


def test_every_helper_is_declared_and_run_as_its_file():
    assert set(HELPERS) == STANDALONE | RUNS_HEAVY | {"chaoskit.injectors.gpu.holder"}
    *python, path = command("chaoskit.injectors.proxy.helper")
    assert python == [sys.executable, "-S", "-P"] and path.endswith("chaoskit/injectors/proxy/helper.py")


@pytest.mark.parametrize("server", SERVERS)
def test_a_proxy_server_runs_on_the_standard_library_and_what_it_shares(server):
    """What proxy_proc imports once it said ready: network.proxy's server its kernel relay alone of chaoskit;
    kv.notify's network.proxy's server (its listener); llm.proxy's its own modules, network.proxy's server and
    the timerfd alarm; mcp.proxy's its own fault table and network.proxy's server; both the fault counts they
    share."""
    mods = imported_by(server)
    ours = sorted(m for m in mods if m.startswith("chaoskit."))
    assert not [m for m in mods if m.split(".")[0] in HEAVY]
    # the family packages (chaoskit.injectors.proxy, ...) are docstrings: importing one imports nothing else
    l4 = ["chaoskit.injectors", "chaoskit.injectors.proxy", "chaoskit.injectors.proxy.server",
          "chaoskit.injectors.proxy.splice"]
    assert ours == {"chaoskit.injectors.proxy.server": ["chaoskit.injectors", "chaoskit.injectors.proxy",
                                                        "chaoskit.injectors.proxy.splice"],
                    "chaoskit.injectors.kv_notify.server": l4,
                    "chaoskit.injectors.llm_proxy.server": sorted([*l4, "chaoskit.injectors.proxy.counts",
                                                                  "chaoskit.injectors.llm_proxy",
                                                                  "chaoskit.injectors.llm_proxy.answers",
                                                                  "chaoskit.injectors.llm_proxy.faults",
                                                                  "chaoskit.injectors.llm_proxy.sse", "chaoskit.load",
                                                                  "chaoskit.load.timer"]),
                    "chaoskit.injectors.mcp_proxy.server": sorted([*l4, "chaoskit.injectors.proxy.counts",
                                                                  "chaoskit.injectors.mcp_proxy",
                                                                  "chaoskit.injectors.mcp_proxy.faults"])}[server]


@pytest.mark.parametrize("module", HELPERS)
def test_a_helper_imports_only_what_it_runs(module):
    mods = imported_by(module)
    assert "chaoskit.injectors.base" not in mods and not any(m.startswith("chaoskit.experiment") for m in mods)
    if module in STANDALONE:
        assert not any(m == "chaoskit" or m.startswith("chaoskit.") for m in mods), sorted(mods)
    if module not in RUNS_HEAVY:
        assert not [m for m in mods if m.split(".")[0] in HEAVY]


def test_the_proxy_forkserver_imports_the_servers_and_nothing_heavy():
    """A run's proxy forkserver (proxy_fork) imports every proxy server once, for its forked helpers, and
    setproctitle; nothing heavy, no fault family."""
    mods = imported_by("chaoskit.injectors.forkserver.main")
    assert not [m for m in mods if m.split(".")[0] in HEAVY]
    assert "chaoskit.injectors.base" not in mods and "setproctitle" in mods
    assert {*SERVERS, "chaoskit.injectors.proxy.helper"} <= mods
    assert set(SERVERS) == set(proxy_fork.SERVERS)


def test_loading_a_run_leaves_the_network_libraries_to_the_probes_and_faults_that_use_them():
    """`chaoskit run` starts without aiohttp, pyroute2 and prometheus_client (~0.2 s of every run's start): the
    probes and faults that use them import them where they do; and no spec model is built before it is used."""
    code = ("import json, sys, chaoskit.app.run, chaoskit.experiment.models as m; "
            "print(json.dumps([sorted(sys.modules), m.Experiment.__pydantic_complete__]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    mods, built = json.loads(out.stdout)
    assert not [m for m in mods if m.split(".")[0] in ("aiohttp", "pyroute2", "prometheus_client")]
    assert built is False
