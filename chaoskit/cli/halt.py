"""`chaoskit halt` and `chaoskit status`: pull or release the halt levers, and list the runs in progress."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from chaoskit.errors import ChaoskitError
from chaoskit.term import Table, console

out = console()
err = console(stderr=True)


def _fail(e: ChaoskitError) -> None:
    for line in str(e).splitlines():
        err.print(f"[red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(e.exit_code)


KUBECONFIG_HELP = "--cluster: kubeconfig (default $KUBECONFIG, ~/.kube/config, the pod's service account)"


def halt(
    cluster: bool = typer.Option(False, "--cluster", help="also the cluster's lever (ConfigMap chaoskit-halt): "
                                 "every run that acts on the cluster stops, from whichever host it runs"),
    reason: str = typer.Option("", "--reason", help="why: shown to everyone whose run stops or is refused"),
    release: bool = typer.Option(False, "--release", help="release the lever(s) instead: runs may start again"),
    kubeconfig: Path | None = typer.Option(None, help=KUBECONFIG_HELP),
    context: str | None = typer.Option(None, help="--cluster: kubeconfig context"),
    namespace: str = typer.Option("chaoskit", help="--cluster: the namespace of the lever"),
) -> None:
    """Stop all chaos: every run on this host (--cluster: also every run acting on the cluster) aborts and rolls
    back (exit 3), and no run starts (exit 4) until `chaoskit halt --release` (with --cluster for both)."""
    from chaoskit.app import halt as lever

    if release and reason:
        _fail(ChaoskitError("--release takes no --reason"))
    pulled = None if release else lever.new_lever(reason)
    if pulled is not None:
        _say_stopping(cluster)
    try:  # this host's lever first: it cannot wait on a network, and the cluster may take a while to reach
        if pulled is None:
            gone = lever.release_host_lever()
            out.print(f"this host's lever {'released' if gone else 'was not pulled'} ({lever.host_lever_path()})")
        else:
            out.print(f"[bold red]halted[/] this host ({lever.pull_host_lever(pulled)}): {escape(pulled.reason)}",
                      highlight=False)
        if cluster:
            _halt_cluster(lever.open_cluster(str(kubeconfig) if kubeconfig else None, context, namespace), pulled)
    except ChaoskitError as e:
        _fail(e)
    if pulled is None:
        raise typer.Exit(0)
    out.print("runs abort and roll back within a safeguard interval; release with: chaoskit halt --release"
              + (" --cluster" if cluster else ""))


def _say_stopping(cluster: bool) -> None:
    """Before the lever is pulled: the runs it stops, those of this state directory (a run with another one, its
    own $CHAOSKIT_STATE_DIR or another user's default, reads another lever)."""
    from chaoskit.app.orphans import runs_in_progress
    from chaoskit.paths import state_dir

    runs = runs_in_progress()
    where = f"state directory {state_dir()}"
    if not runs:
        out.print(f"no run in progress in {where}" + (" (and the cluster's runs, wherever they run)" if cluster
                                                       else ""), highlight=False, soft_wrap=True)
    else:
        out.print(f"stopping {len(runs)} run{'s' if len(runs) > 1 else ''} of {where}:", highlight=False,
                  soft_wrap=True)
    for r in runs:
        faults = ", ".join(r.faults) or "no fault yet"
        out.print(f"  {escape(r.experiment)} (run {r.run_id}, PID {r.pid if r.pid is not None else '?'}): "
                  f"{escape(faults)}; {escape(r.state)}", highlight=False, soft_wrap=True)


def _halt_cluster(where: Any, pulled: Any) -> None:
    """Pull (or, `pulled` None, release) the lever of cluster `where` (an app.halt.Cluster)."""
    from chaoskit.app.halt import in_cluster
    from chaoskit.executors import k8s_halt

    what = f"cluster {escape(where.name)} (ConfigMap {where.namespace}/{k8s_halt.HALT_CONFIGMAP})"
    if pulled is None:
        gone = in_cluster(where, "release the halt lever", lambda: k8s_halt.release_lever(where.core, where.namespace))
        out.print(f"the lever of {what} {'released' if gone else 'was not pulled'}", highlight=False)
        return
    in_cluster(where, "pull the halt lever", lambda: k8s_halt.pull_lever(where.core, pulled, where.namespace))
    out.print(f"[bold red]halted[/] {what}", highlight=False)


def status(
    cluster: bool = typer.Option(False, "--cluster", help="also the runs with faults recorded in the cluster (its "
                                 "revert ConfigMaps) and its halt lever"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    kubeconfig: Path | None = typer.Option(None, help=KUBECONFIG_HELP),
    context: str | None = typer.Option(None, help="--cluster: kubeconfig context"),
    namespace: str = typer.Option("chaoskit", help="--cluster: the namespace of the lever and revert ConfigMaps"),
) -> None:
    """The halt levers and the runs in progress: on this host (its ledgers), with --cluster also in the cluster."""
    from dataclasses import asdict

    from chaoskit.app import halt as lever
    from chaoskit.app.orphans import runs_in_progress
    from chaoskit.executors import k8s_halt

    levers, runs, remote = [lever.read_host_lever()], runs_in_progress(), []
    try:
        if cluster:
            where = lever.open_cluster(str(kubeconfig) if kubeconfig else None, context, namespace)
            levers.append(lever.in_cluster(where, "read the halt lever", lambda: k8s_halt.read_lever(
                where.core, namespace, f"in cluster {where.name} namespace {namespace}")))
            remote = lever.in_cluster(where, "list the revert records", lambda: k8s_halt.cluster_runs(where.core, namespace))
    except ChaoskitError as e:
        _fail(e)
    pulled = [lv for lv in levers if lv is not None]
    if as_json:
        print(json.dumps({"halted": [asdict(lv) for lv in pulled], "runs": [asdict(r) for r in runs],
                          "cluster_runs": [{**asdict(r), "experiment": r.experiment} for r in remote] if cluster
                          else None}, indent=2))
        raise typer.Exit(0)
    for lv in pulled:
        out.print(f"[bold red]HALTED[/] {escape(lv.describe())}", highlight=False)
    if not pulled:
        out.print("not halted" + (" (this host and the cluster)" if cluster else " (this host)"))
    _runs_table("runs in progress on this host", [
        (r.host, r.run_id, r.experiment, ", ".join(r.faults) or "none yet", r.since, r.state) for r in runs])
    _say_held(runs)
    if cluster:
        _runs_table(f"runs with faults recorded in the cluster (namespace {namespace})", [
            (r.host, r.run_id, r.experiment, ", ".join(f"{f.type} on {f.node}/{f.pod} ({f.state})" for f in r.faults),
             r.since, "recorded in the cluster") for r in remote])


def _say_held(runs: list[Any]) -> None:
    """Each fault that may be in effect, with what it holds on this host (where to look for it)."""
    for r in runs:
        if not r.held:
            continue
        out.print(f"faults of {escape(r.experiment)} (run {r.run_id}), newest first:", highlight=False,
                  soft_wrap=True)
        for f in r.held:
            out.print(f"  #{f.id} {f.type} ({'applied' if f.applied else 'applying: maybe partly applied'})",
                      highlight=False, soft_wrap=True)
            for item in f.holds:
                out.print(f"    {escape(item)}", highlight=False, soft_wrap=True)


def _runs_table(title: str, rows: list[tuple[str, str, str, str, float | None, str]]) -> None:
    import time

    if not rows:
        out.print(f"{title}: none")
        return
    table = Table(title=title, title_justify="left")
    for column in ("host", "run", "experiment", "faults in effect", "since", "state"):
        table.add_column(column)
    for host, run_id, experiment, faults, since, state in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
        table.add_row(host, run_id, experiment, faults, when, state)
    out.print(table)
