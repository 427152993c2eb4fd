"""What a run records about itself before it starts, so its report can be rebuilt from the journal alone: the
experiment exactly as run (after includes and substitution) with its tolerances and safeguard rules as data,
and the host's facts (kernel, CPUs, memory, and the quick `chaoskit doctor` checks)."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

from chaoskit import __version__
from chaoskit.experiment.loader import Loaded
from chaoskit.model.events import ExperimentRecorded, HostFacts, RuleRecord, SafeguardRecord
from chaoskit.model.tolerance import Rule, parse_rule

# doctor checks left out of a run's host facts: they compile or create kernel objects (seconds, and they would
# disturb the experiment); `chaoskit doctor` runs them
SLOW_CHECKS = ("_ebpf", "_netem", "_load_sender")


def experiment_record(loaded: Loaded) -> ExperimentRecorded:
    """The journal's `experiment` event: the file, its variables, the document as run, tolerances, safeguards."""
    exp = loaded.experiment
    probes = list(exp.steady_state.probes) + [sg.probe for sg in exp.safeguards if not isinstance(sg.probe, str)]
    return ExperimentRecorded(
        file=str(loaded.path), name=exp.metadata.name, description=exp.metadata.description, vars=loaded.variables,
        document=loaded.located.data,
        expect={p.name: {k: t.to_json() for k, t in p.flat_expect().items()} for p in probes},
        safeguards=[SafeguardRecord(probe=sg.probe if isinstance(sg.probe, str) else sg.probe.name,
                                    rules=[_rule(r) for r in sg.rules()], on_error=sg.on_error)
                    for sg in exp.safeguards],
    )


def _rule(rule: Rule | Any) -> RuleRecord:
    return RuleRecord(**(rule if isinstance(rule, Rule) else parse_rule(rule)).to_json())


def host_facts() -> HostFacts:
    """The journal's `host` event (about 50 ms: the doctor checks that neither compile nor create anything)."""
    from chaoskit.doctor import CHECKS

    u = os.uname()
    checks = []
    for fn in CHECKS:
        if fn.__name__ in SLOW_CHECKS:
            continue
        try:
            c = fn()
            checks.append({"area": c.area, "ok": c.ok, "detail": c.detail})
        except Exception as e:  # a broken check says so, as in `chaoskit doctor`
            checks.append({"area": fn.__name__.strip("_"), "ok": False, "detail": f"check failed: {e}"})
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    return HostFacts(
        hostname=socket.gethostname(),
        kernel=f"{u.sysname} {u.release} {u.version}",
        machine=u.machine,
        cpus=os.cpu_count(),
        memory_bytes=mem,
        python=f"{platform.python_implementation()} {sys.version.split()[0]}",
        chaoskit=__version__,
        euid=os.geteuid(),
        doctor=checks,
        doctor_skipped=[f.strip("_") for f in SLOW_CHECKS],
    )
