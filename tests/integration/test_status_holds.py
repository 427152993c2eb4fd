"""`chaoskit status` says what each fault of a run holds, as the kernel has it: a queue-mode network.netem's nft
table and queue (with the command that shows its NFQUEUE rule, which `nft list ruleset` cannot print) and its
helper, a network.drop's table; `chaoskit halt` names the run it stops (experiment, run, PID, state directory)
before it pulls the lever."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import chaoskit, ledgers, wait_for, write
from tests.helpers.netpair import Pair, queue_mode_missing, sh

MISSING = queue_mode_missing()
pytestmark = [pytest.mark.root, pytest.mark.timeout(120),
              pytest.mark.skipif(MISSING is not None, reason=f"queue mode cannot run here: {MISSING}")]
EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: holds-demo}
steadyState:
  probes: [{name: t, type: command, argv: ["true"]}]
  during: {every: 0.5s}
method:
  - parallel:
      - inject: {type: network.netem, target: {netns: "{ns}"}, mode: queue, delay: 20ms}
        duration: 60s
      - inject: {type: network.drop, target: {netns: "{ns}"}, percent: 10%}
        duration: 60s
"""


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


def in_ns(ns: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)


def tables(ns: str) -> set[str]:
    """The nft tables of the namespace, as nft itself lists them (an observer independent of chaoskit)."""
    listed = json.loads(sh("ip", "netns", "exec", ns, "nft", "-j", "list", "tables"))["nftables"]
    return {t["table"]["name"] for t in listed if "table" in t and t["table"]["family"] == "inet"}


def applied(state: Path) -> bool:
    lines = [json.loads(x) for f in ledgers(state) for x in f.read_text().splitlines()]
    return sum(x["op"] == "applied" for x in lines) == 2


def held(status: str) -> dict[str, list[str]]:
    """What `chaoskit status` says each fault holds: {type: its lines}, from its `  #ID TYPE (state)` lines and
    the lines indented under them."""
    out: dict[str, list[str]] = {}
    for line in status.splitlines():
        if line.startswith("  #"):
            out[line.split()[1]] = current = []
        elif line.startswith("    "):
            current.append(line.strip())
    return out


def test_status_names_the_kernel_objects_and_halt_the_runs(tmp_path, pair):
    state, ns = tmp_path / "state", pair.cli
    path = pair.path(ns)
    run = chaoskit("run", str(write(tmp_path / "e.yaml", EXPERIMENT)), "--var", f"ns={ns}", "--plain", "--out",
                   str(tmp_path / "out"), state=state)
    try:
        wait_for(lambda: applied(state) or run.poll() is not None, timeout=60, every=0.1)
        assert run.poll() is None, run.communicate()
        (queue_table,) = [t for t in tables(ns) if t.startswith("chaoskit_nq_")]
        (drop_table,) = tables(ns) - {queue_table}
        ((queue, helper),) = [(int(f[0]), int(f[1])) for f in (line.split() for line in in_ns(
            ns, "cat", "/proc/net/netfilter/nfnetlink_queue").stdout.splitlines())]  # queue number, bound PID

        st = chaoskit("status", state=state)
        out, err = st.communicate(timeout=60)
        assert st.returncode == 0, err
        holds = held(out)
        assert sorted(holds) == ["network.drop", "network.netem"], out
        see = f"nsenter --net={path} nft --debug=netlink list table inet {queue_table}"
        netem, drop = holds["network.netem"], holds["network.drop"]
        assert netem[0] == (f"nft table inet {queue_table} in netns {path}: egress packets of eth0 go to its chain "
                            "queue, whose NFQUEUE rule nft list ruleset cannot print (an xtables-compat expression); "
                            f"see it: {see}"), out
        assert netem[1].startswith(f"NFQUEUE {queue} in netns {path}, helper PID {helper} (netemq-"), out
        assert netem[1].endswith(f"running; see it: nsenter --net={path} cat /proc/net/netfilter/nfnetlink_queue")
        assert drop == [f"nft table inet {drop_table} in netns {path}; see it: nsenter --net={path} nft list table "
                        f"inet {drop_table}"], out
        # what the netem page says: nft list ruleset prints the chain empty; the command status names shows the rule
        ruleset = in_ns(ns, "nft", "list", "ruleset")
        assert "NFQUEUE" not in ruleset.stdout and "XT target NFQUEUE not found" in ruleset.stderr, ruleset
        shown = subprocess.run(see.split(), capture_output=True, text=True, timeout=30)
        assert "[ target name NFQUEUE rev 3 ]" in shown.stdout, shown

        run_id = ledgers(state)[0].stem  # before the halt: the run removes its ledger once it has reverted
        halt = chaoskit("halt", "--reason", "seen enough", state=state)
        said, err = halt.communicate(timeout=60)
        assert halt.returncode == 0, err
        lines = said.splitlines()
        assert lines[0] == f"stopping 1 run of state directory {state}:", said
        assert lines[1].startswith(f"  holds-demo (run {run_id}, PID {run.pid}): network.") and \
            lines[1].endswith("; running") and "network.drop" in lines[1] and "network.netem" in lines[1], said
        assert lines[2] == f"halted this host ({state / 'halt.json'}): seen enough", said
        assert run.wait(timeout=60) == 3
        assert tables(ns) == set()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
            chaoskit("rollback", "--all", state=state).communicate(timeout=60)
        chaoskit("halt", "--release", state=state).communicate(timeout=60)
