"""ExitWatch reports each watched process that exits once; process.signal watches only what it stopped; the live
view shows the news."""

from __future__ import annotations

import io
import os
import subprocess
import time

import psutil
from rich.console import Console

from chaoskit.engine.target_exits import ExitWatch
from chaoskit.injectors.process.fault import ProcessSignal, ProcessSignalSpec
from chaoskit.model.events import FaultApplied, TargetExited, from_json
from chaoskit.targets.process import ProcessRef, proc_ref
from chaoskit.ui import LiveView, PlainView


def test_an_exit_is_reported_once_and_only_for_the_process_that_exited() -> None:
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    try:
        refs = [proc_ref(p.pid) for p in procs]
        watch = ExitWatch()
        watch.watch(7, "stop", "process.signal", [r for r in refs if r is not None])
        assert watch.check() == []
        procs[0].kill()
        procs[0].wait()  # reaped: gone, not a zombie
        exits = watch.check()
        assert [(e.id, e.pid, e.comm, e.zombie) for e in exits] == [(7, procs[0].pid, "sleep", False)]
        assert exits[0].text == f"PID {procs[0].pid} sleep exited during the fault"
        assert watch.check() == []  # once
        assert from_json(exits[0].to_json()) == exits[0]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_service_a_target_belongs_to_is_watched_and_exits_are_labelled_by_stage() -> None:
    """The stopped process's ancestors in its process group (its server) are watched too; exits say when."""
    server = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    try:
        child = _wait_child(server.pid)
        watch = ExitWatch()
        watch.watch(3, "stop-stub", "process.signal", [child])
        watch.stage(3, "after")
        server.kill()
        server.wait()
        exits = watch.check()
        assert [(e.pid, e.service_of, e.when) for e in exits] == [(server.pid, child.pid, "after")]
        assert exits[0].text == f"PID {server.pid} sh (the service of PID {child.pid}) exited after the fault was " \
                                "reverted"
    finally:
        os.killpg(server.pid, 9)


def _wait_child(pid: int) -> ProcessRef:
    for _ in range(200):
        kids = psutil.Process(pid).children()
        if kids and (ref := proc_ref(kids[0].pid)) is not None:
            return ref
        time.sleep(0.01)
    raise AssertionError("sh started no child")


def test_process_signal_watches_what_it_stopped_not_what_it_killed() -> None:
    target = {"pid": 123, "start_time": 45, "comm": "x"}
    stop = ProcessSignal(ProcessSignalSpec(type="process.signal", pid=123))
    assert [r.pid for r in stop.watched_processes(ProcessSignal.read_record({"signal": "SIGSTOP",
                                                                              "targets": [target]}))] == [123]
    kill = ProcessSignal(ProcessSignalSpec(type="process.signal", pid=123, signal="SIGTERM"))
    assert kill.watched_processes(ProcessSignal.read_record({"signal": "SIGTERM", "targets": [target]})) == []


EVENT = {"t": 1.0, "event": "target_exited", "id": 1, "step": "stop-stub", "type": "process.signal", "pid": 29566,
         "comm": "triton_python_backend_stub", "start_time": 9, "zombie": True, "seen_at": 1.0,
         "when": "during", "service_of": None, "expected": False,
         "text": "PID 29566 triton_python_backend_stub exited during the fault (a zombie: its parent has not "
                 "reaped it)"}


def test_the_views_show_the_exit() -> None:
    line = "fault #1 process.signal (stop-stub): PID 29566 triton_python_backend_stub exited during the fault"
    plain = Console(file=io.StringIO(), width=300)
    event = from_json(EVENT)
    assert isinstance(event, TargetExited) and event.to_json() == EVENT
    PlainView(plain)(event)
    assert line in plain.file.getvalue()
    live_console = Console(file=io.StringIO(), width=300, record=True)
    live = LiveView(live_console, "x")
    live(FaultApplied(t=0.5, id=1, step="stop-stub", type="process.signal", applied_at=0.5))
    live(event)
    live_console.print(live._render())
    assert line in live_console.export_text()
