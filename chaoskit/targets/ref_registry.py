"""Where reference deployments are, and the registry that remembers the ones `chaoskit ref up` started.

A deployment lives in a state directory of its own (its records processes.json, facts.json and netns.json, and its
logs). `chaoskit ref up` also writes one entry per deployment into the registry, STATE/references/ (STATE is
chaoskit.paths.state_dir(): the same for an installed wheel and a source tree), naming that directory, its engine
and the `ref up` process. A command told no directory (neither --dir nor $CHAOSKIT_REF_DIR) looks in the working
directory's .chaoskit/ref, then in the registry. Reading the registry removes the entries whose deployment has
nothing left: no recorded process (or its process group) alive, no network namespace of it left, and the `ref up`
that wrote it gone."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from chaoskit.errors import ChaoskitError
from chaoskit.model.types import StrictModel
from chaoskit.paths import state_dir
from chaoskit.targets.process import ProcessRef, group_members, is_alive, proc_ref

REF_DIR_ENV = "CHAOSKIT_REF_DIR"
DEFAULT_DIR = Path(".chaoskit") / "ref"  # relative to the working directory
PROCESSES, FACTS, NETNS = "processes.json", "facts.json", "netns.json"  # a deployment's records in its directory
NETNS_ROOT = Path("/run/netns")  # where `ip netns` (pyroute2) names its namespaces


class StartedBy(StrictModel):
    """The `chaoskit ref up` process that wrote an entry (pid + kernel start time: a reused PID is not it)."""

    pid: int = Field(gt=0)
    start_time: int = Field(ge=0)
    comm: str = ""

    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_time, self.comm)


class Entry(StrictModel):
    """One file of the registry: a deployment `chaoskit ref up` started."""

    version: Literal[1] = 1
    dir: str = Field(min_length=1, description="the deployment's state directory (absolute)")
    engine: str = Field(min_length=1, description="triton, vllm (as `ref up --engine`)")
    started_at: float = Field(description="when `ref up` began (Unix time)")
    started_by: StartedBy


class State(StrEnum):
    RUNNING = "running"  # a recorded process alive, facts published
    STARTING = "starting"  # its `ref up` still at work
    UNFINISHED = "unfinished"  # processes alive, no facts, its `ref up` gone (killed): `ref down` stops them
    LEFTOVER = "leftover"  # nothing alive, but network namespaces of it left: `ref down` deletes them
    GONE = "gone"  # nothing left (or never anything recorded)


@dataclass(frozen=True)
class Found:
    """A deployment directory a search names, how it was found and what is in it."""

    dir: Path
    source: str  # "--dir", "$CHAOSKIT_REF_DIR", "the working directory's .chaoskit/ref", "the registry"
    state: State
    engine: str | None = None  # from its facts, else its registry entry
    started_at: float | None = None  # registry entries only

    def summary(self) -> str:
        """Its engine, state and start, in words."""
        when = f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started_at))}" \
            if self.started_at is not None else ""
        return f"{self.engine or 'engine unknown'}, {self.state}{when}"

    def describe(self) -> str:
        return f"{self.dir} ({self.summary()}; {self.source})"


@dataclass(frozen=True)
class Search:
    """Where a command looked for a reference deployment (every place, in words) and what it found there. `named`:
    a directory was named (--dir, $CHAOSKIT_REF_DIR): `found` is that directory alone, whatever is in it."""

    found: tuple[Found, ...]
    looked: tuple[str, ...]
    named: bool

    def where(self) -> str:
        """The places looked, one per line."""
        return "\n".join(f"  - {place}" for place in self.looked)

    def one(self, verb: str) -> Found | None:
        """The deployment `chaoskit ref VERB` acts on: the named directory, else the only one found; None when
        none was found; a ChaoskitError naming each one (and the command for it) when several were."""
        if self.named or len(self.found) <= 1:
            return self.found[0] if self.found else None
        lines = [f"{len(self.found)} reference deployments found; name one with --dir:"]
        lines += [f"  {command(verb, f.dir, named=True)}   # {f.summary()}, {f.source}" for f in self.found]
        raise ChaoskitError("\n".join(lines))


def _abs(path: Path) -> Path:
    """`path` resolved; as given where it cannot be (a relative path in a working directory that was removed)."""
    try:
        return path.resolve()
    except OSError:
        return path


def default_dir() -> Path:
    """The directory `ref up` uses when told none: $CHAOSKIT_REF_DIR, else .chaoskit/ref in the working directory."""
    return Path(os.environ.get(REF_DIR_ENV) or DEFAULT_DIR)


def command(verb: str, root: Path, named: bool = False) -> str:
    """`chaoskit ref VERB` as the user types it for the deployment in `root`: with --dir unless `root` is where the
    command looks first without it (or `named`: always)."""
    if not named and _abs(root) == _abs(default_dir()):
        return f"chaoskit ref {verb}"
    return f"chaoskit ref {verb} --dir {shlex.quote(str(root))}"


def registry_dir() -> Path:
    return state_dir() / "references"


def _entry_file(root: Path) -> Path:
    return registry_dir() / f"{hashlib.sha256(str(_abs(root)).encode()).hexdigest()[:16]}.json"


def register(root: Path, engine: str) -> Path:
    """Record the deployment in `root` (started by this process) in the registry; the entry's path. A ChaoskitError
    when the state directory cannot be written."""
    me = proc_ref(os.getpid())
    assert me is not None  # this process
    entry = Entry(dir=str(_abs(root)), engine=engine, started_at=time.time(),
                  started_by=StartedBy(pid=me.pid, start_time=me.start_time, comm=me.comm))
    path = _entry_file(root)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(entry.model_dump_json(indent=2))
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ChaoskitError(f"cannot record the deployment in the registry {path.parent}: {e}") from None
    return path


def unregister(root: Path) -> None:
    """Remove the registry's entry of the deployment in `root`, if any."""
    try:
        _entry_file(root).unlink(missing_ok=True)
    except OSError:
        pass  # another user's state directory: its own reads prune it


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _processes(root: Path) -> list[ProcessRef]:
    records = _load(root / PROCESSES)
    refs = []
    for r in records if isinstance(records, list) else []:
        try:
            refs.append(ProcessRef.from_json(r))
        except (KeyError, TypeError, ValueError):
            continue
    return refs


def state(root: Path, started_by: ProcessRef | None = None) -> State:
    """What is left of the deployment in `root` (see State)."""
    procs = _processes(root)
    alive = any(is_alive(r) for r in procs) or any(group_members(r.pid) for r in procs)
    if alive and (root / FACTS).is_file():
        return State.RUNNING
    if started_by is not None and is_alive(started_by):
        return State.STARTING
    if alive:
        return State.UNFINISHED
    names = _load(root / NETNS)
    if isinstance(names, list) and any(isinstance(n, str) and (NETNS_ROOT / n).exists() for n in names):
        return State.LEFTOVER
    return State.GONE


def _engine(root: Path) -> str | None:
    facts = _load(root / FACTS)
    engine = facts.get("engine") if isinstance(facts, dict) else None
    return engine if isinstance(engine, str) else None


def registered(exclude: Iterable[Path] = ()) -> tuple[list[Found], str]:
    """The registry's deployments that have something left (oldest first), less those in `exclude`; and what the
    registry held, in words. Entries whose deployment is gone are removed; unreadable ones are skipped (named)."""
    reg = registry_dir()
    skip = {_abs(p) for p in exclude}
    found: list[Found] = []
    pruned: list[str] = []
    unreadable: list[str] = []
    try:
        files = sorted(reg.glob("*.json")) if reg.is_dir() else []
    except OSError as e:
        return [], f"the registry of deployments `chaoskit ref up` started ({reg}): cannot be read: {e}"
    for f in files:
        try:
            entry = Entry.model_validate_json(f.read_bytes())
        except FileNotFoundError:
            continue  # removed meanwhile
        except OSError as e:
            unreadable.append(f"{f.name} ({e.strerror or e})")
            continue
        except ValidationError as e:
            unreadable.append(f"{f.name} ({e.error_count()} problem{'s' if e.error_count() != 1 else ''}: "
                              f"{e.errors()[0]['msg']})")
            continue
        root = Path(entry.dir)
        st = state(root, entry.started_by.ref())
        if st is State.GONE:
            try:
                f.unlink(missing_ok=True)
            except OSError:
                pass  # another user's registry: gone from what we report all the same
            pruned.append(entry.dir)
            continue
        if _abs(root) in skip:
            continue
        found.append(Found(root, "the registry", st, _engine(root) or entry.engine, entry.started_at))
    found.sort(key=lambda x: x.started_at or 0.0)
    held = ", ".join(f"{f.dir} ({f.summary()})" for f in found) if found else "no deployment with anything left"
    if pruned:
        held += f" (removed {len(pruned)} whose deployment is gone: {', '.join(pruned)})"
    if unreadable:
        held += f"; skipped unreadable entries: {', '.join(unreadable)}"
    return found, f"the registry of deployments `chaoskit ref up` started ({reg}): {held}"


def _content(root: Path, st: State) -> str:
    return "nothing recorded" if st is State.GONE else str(st)


def _here() -> Path:
    """The working directory's .chaoskit/ref, absolute."""
    return _abs(DEFAULT_DIR)


def search(named: Path | None = None) -> Search:
    """Where the reference deployment is: `named` (--dir) alone, else $CHAOSKIT_REF_DIR alone, else the working
    directory's .chaoskit/ref when something of a deployment is left there, else every deployment in the registry."""
    for source, given in (("--dir", named), (f"${REF_DIR_ENV}", os.environ.get(REF_DIR_ENV) or None)):
        if given is not None:
            root = _abs(Path(given))
            st = state(root)
            looked = f"{source} {root}: {_content(root, st)}"
            if source != "--dir":
                looked += " (the registry is not read while it is set)"
            return Search((Found(root, source, st, _engine(root)),), (looked,), named=True)
    here = _here()
    st = state(here)
    looked = [f"the working directory's {DEFAULT_DIR} ({here}): {_content(here, st)}"]
    if st is not State.GONE:
        return Search((Found(here, f"the working directory's {DEFAULT_DIR}", st, _engine(here)),), tuple(looked),
                      named=False)
    found, held = registered(exclude=(here,))
    return Search(tuple(found), (*looked, held), named=False)


def every_dir() -> list[Path]:
    """Every deployment directory a run may reuse a deployment from (one with the settings it declares):
    $CHAOSKIT_REF_DIR alone when set; else the working directory's .chaoskit/ref and each of the registry's."""
    if os.environ.get(REF_DIR_ENV):
        return [_abs(Path(os.environ[REF_DIR_ENV]))]
    here = _here()
    return [here, *(f.dir for f in registered(exclude=(here,))[0])]


def facts_dir(search_result: Search, engine: str) -> tuple[Path | None, str]:
    """The directory whose facts an experiment's `target.reference: ENGINE` uses: a named one's when it has facts,
    else the one running deployment the search found; else None and why (every place looked, what to do)."""
    start = (f"start one with `chaoskit ref up --engine {engine}` (with any --dir: the registry remembers it), or "
             f"name its directory in ${REF_DIR_ENV}")
    if search_result.named:  # its facts, as they are (a test's or a tool's hand-made facts.json included)
        root = search_result.found[0].dir
        if (root / FACTS).is_file():
            return root, ""
        return None, (f"the reference deployment is not running (no {root / FACTS}); looked in:\n"
                      f"{search_result.where()}\n{start}")
    running = [f for f in search_result.found if f.state is State.RUNNING]
    if len(running) == 1:
        return running[0].dir, ""
    if len(running) > 1:
        names = "\n".join(f"  - {f.describe()}" for f in running)
        return None, (f"{len(running)} reference deployments are running:\n{names}\n"
                      f"name the one to use in ${REF_DIR_ENV} (e.g. {REF_DIR_ENV}={shlex.quote(str(running[0].dir))})")
    not_running = [f for f in search_result.found if f.state is not State.GONE]
    why = "the reference deployment is not running: none found; looked in:\n" + search_result.where()
    if not_running:
        why += "\n" + "\n".join(f"  ({f.dir}: {f.state}; `{command('status', f.dir)}` says more)"
                                for f in not_running)
    return None, f"{why}\n{start}"
