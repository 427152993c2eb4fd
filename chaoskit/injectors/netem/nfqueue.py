"""network.netem's queue mode (no sch_netem needed): the selected packets go to an NFQUEUE whose native helper
(nfqueue.c, built at first use) holds each one until its time, drops, duplicates, corrupts, reorders and
rate-limits them with sch_netem's rules. Revert removes the rule first, then stops the helper, then deletes the
table; the queue rule's bypass flag lets packets through whenever no helper is bound (killed, exited): it fails open."""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field, model_validator

from chaoskit import cbuild, paths
from chaoskit.errors import PreflightError
from chaoskit.injectors import helper_proc
from chaoskit.injectors.base import RevertRecord
from chaoskit.injectors.netem import nfqueue_nft as nft
from chaoskit.targets import nftables
from chaoskit.targets.local import NetnsTarget
from chaoskit.targets.netns import same_namespace
from chaoskit.targets.process import ProcessRef, cmdline, proc_ref
from chaoskit.units import parse_rate

SOURCE = Path(__file__).with_name("nfqueue.c")
CFLAGS = ("-O2", "-Wall")
QUEUE_BASE = 20000  # the helper binds the first free queue number from a random start above this
TOKEN_PREFIX, TABLE_PREFIX = "chaoskit-netemq-", "chaoskit_nq_"
IFNAME = r"^[^/:\s]{1,15}$"  # what the kernel takes as an interface name (dev_valid_name)


class InterfaceRecord(RevertRecord):
    """The part of a network.netem / network.bandwidth record that says where: the namespace (its path and inode:
    a namespace reused under that path is not touched), the interface by index and name, the direction."""

    ns: str = Field(min_length=1)
    ns_inode: int = Field(gt=0)
    ifindex: int = Field(gt=0)
    ifname: str = Field(pattern=IFNAME)
    direction: Literal["egress", "ingress"]

    def same_namespace(self) -> bool:
        return same_namespace({"ns": self.ns, "ns_inode": self.ns_inode})


class QueueRecord(InterfaceRecord):
    """network.netem's record in queue mode: the table, always one of chaoskit's netem queue tables; the helper's
    token, of chaoskit's shape (revert stops the process carrying it); its stats file, named after the token
    (revert deletes it); once applied, the helper and the queue it bound."""

    mode: Literal["queue"]
    mode_reason: str = ""
    table: str = Field(pattern=rf"^{TABLE_PREFIX}[0-9a-f]{{12}}$")
    token: str = Field(pattern=rf"^{TOKEN_PREFIX}[0-9a-f]{{32}}$")
    stats: str = Field(min_length=1)
    helper: ProcessRef | None = None
    queue: int | None = Field(None, ge=0, le=65535)

    @model_validator(mode="after")
    def _own_stats(self) -> QueueRecord:
        if Path(self.stats).name != f"{self.token}.json":
            raise ValueError(f"{self.stats} is not the stats file of helper {self.token}")
        return self


def build() -> Path:
    """The helper executable for this nfqueue.c (compiled into the cache on first use)."""
    try:
        return cbuild.build(SOURCE, "netemq", CFLAGS)
    except cbuild.NoCompiler:
        raise PreflightError("network.netem (queue mode) builds its helper with a C compiler: "
                             "apt install gcc libc6-dev") from None
    except cbuild.CompileFailed as e:
        raise PreflightError(f"network.netem: {e}") from None


def helper_args(spec: Any, ifname: str, dist_file: str | None, stats: str, until: float) -> list[str]:
    """network.netem's spec (a NetemSpec) as the helper's key=value arguments."""
    kv: dict[str, str | int | float] = {
        "delay_ns": round(spec.delay * 1e9), "jitter_ns": round(spec.jitter * 1e9), "delay_corr": spec.correlation,
        "loss": spec.loss, "loss_corr": spec.loss_correlation, "duplicate": spec.duplicate,
        "duplicate_corr": spec.duplicate_correlation, "corrupt": spec.corrupt,
        "corrupt_corr": spec.corrupt_correlation, "reorder": spec.reorder, "reorder_corr": spec.reorder_correlation,
        "gap": max(spec.gap, 1) if spec.reorder else 0,  # as tc: reorder without a gap means gap 1
        "rate": parse_rate(spec.rate) if spec.rate is not None else 0, "limit": spec.limit,
        "mark": nft.COPY_MARK, "queue": QUEUE_BASE + random.randrange(0, 40000), "stats": stats,
        "until": f"{until:.3f}",
    }
    if dist_file:
        kv["dist"] = dist_file
    if spec.direction == "egress":  # hold copies and free the originals; the copies leave by the interface
        kv.update(detach=1, dev=ifname)
    return [f"{k}={v}" for k, v in kv.items()]


def preflight(t: NetnsTarget) -> None:
    """The helper builds, nftables works in the namespace, and no other queue-mode netem is there: its copies
    carry the mark every such rule lets pass, so a second one would see only the packets the first passed."""
    build()
    try:
        tables = nftables.tables(t.ns_path)  # libnftables itself, which apply uses
    except (nftables.NftError, OSError) as e:
        raise PreflightError(f"network.netem (queue mode): nftables unusable in {t.label}: {e}") from None
    if ours := sorted(x["name"] for x in tables if x["name"].startswith(TABLE_PREFIX)):
        raise PreflightError(f"network.netem (queue mode): {t.label} already has a chaoskit netem queue "
                             f"({', '.join(ours)}: another run, or a leftover: `chaoskit rollback --all`)")


def plan(spec: Any, t: NetnsTarget, reason: str) -> list[str]:
    """The plan lines of queue mode."""
    hook = nft.hook_chain(spec.direction)
    dev = "oif" if spec.direction == "egress" else "iif"
    scope = f"{dev} {t.ifname}"
    if spec.filter:
        scope += ", " + ", ".join(filter(None, (
            f"ip daddr {{{', '.join(spec.filter.destinations)}}}" if spec.filter.destinations else "",
            f"tcp/udp dport {{{', '.join(map(str, spec.filter.ports))}}}" if spec.filter.ports else "")))
    held = ("a copy of each packet until its time (the original is freed at once, as sch_netem orphans it; the "
            "copy leaves through a marked raw socket)" if spec.direction == "egress" else "each packet until its time")
    return [f"mode queue ({reason})",
            f"start the netemq helper in {t.label} ({spec.describe()}; it holds {held})",
            f"add nft table {nft.FAMILY} chaoskit_nq_<id> in {t.label}: {hook} packets ({scope}) -> NFQUEUE "
            f"with bypass (packets pass whenever no helper is bound)",
            "revert: flush the rule, stop the helper (SIGTERM: held packets go at once), delete the table"]


def stats_dir() -> Path:
    """Where the helper writes its counters: the temporary directory, or in a helper pod (a read-only root
    filesystem: no usable one) the state directory, its emptyDir."""
    try:
        return Path(tempfile.gettempdir())
    except FileNotFoundError:
        out = paths.state_dir()
        out.mkdir(parents=True, exist_ok=True)
        return out


def prepare(t: NetnsTarget, direction: Literal["egress", "ingress"], reason: str) -> QueueRecord:
    token = f"{TOKEN_PREFIX}{uuid.uuid4().hex}"
    assert t.ifindex is not None and t.ifname is not None  # a qdisc fault's target always names its interface
    return QueueRecord(mode="queue", mode_reason=reason, ns=t.ns_path, ns_inode=t.ns_inode, ifindex=t.ifindex,
                       ifname=t.ifname, direction=direction, table=f"{TABLE_PREFIX}{token[-12:]}", token=token,
                       stats=str(stats_dir() / f"{token}.json"))


def spawn(exe: Path, token: str, ns_path: str, args: list[str]) -> tuple[ProcessRef, int]:
    """Start the helper in its own session; wait for `ready QUEUE`; its identity and the queue it bound."""
    proc = subprocess.Popen([str(exe), token, ns_path, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "ready":
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"the netemq helper failed to start (exit {proc.returncode}): {err.strip()[-500:]}")
    proc.stdout.close()
    proc.stderr.close()
    ref = proc_ref(proc.pid) if token in cmdline(proc.pid) else None
    return (ref if ref is not None else ProcessRef(proc.pid, 0)), int(line[1])


def apply(spec: Any, record: QueueRecord, dist_file: str | None, lifetime_s: float) -> QueueRecord:
    """Helper first (bound to its queue), then the rule: from then on the selected packets go through it."""
    args = helper_args(spec, record.ifname, dist_file, record.stats, time.time() + lifetime_s)
    ref, queue = spawn(build(), record.token, record.ns, args)
    record = record.model_copy(update={"helper": ref, "queue": queue})
    f = spec.filter
    matches = nft.selection(record.direction, record.ifname, f.destinations if f else None, f.ports if f else None)
    nft.install(record.ns, record.table, record.direction, matches, queue)
    return record


def revert(r: QueueRecord) -> None:
    """The rule first (new packets pass untouched), then the helper (SIGTERM: what it holds goes at once), then
    the rest of the table (only now: unregistering its hook would drop the packets still held)."""
    here = r.same_namespace()
    if here:
        nft.withdraw(r.ns, r.table, r.direction)
    helper_proc.stop(r.token, ref=r.helper)
    if here:
        nft.remove(r.ns, r.table)
    Path(r.stats).unlink(missing_ok=True)
    Path(r.stats + ".tmp").unlink(missing_ok=True)


def observe(r: QueueRecord) -> bool:
    """In effect: the table is there and its helper is running."""
    return r.same_namespace() and nft.present(r.ns, r.table) and helper_proc.running(r.token, r.helper)


def holds(r: QueueRecord) -> list[str]:
    """What a queue-mode fault holds, in words (`chaoskit status`): its nft table, whose NFQUEUE rule is an
    xtables-compat expression that `nft list ruleset` cannot print (`XT target NFQUEUE not found`, an empty
    chain), with the command that shows it; the queue and its helper; the helper's stats file."""
    show = f"nsenter --net={r.ns} nft --debug=netlink list table {nft.FAMILY} {r.table}"
    helper = "not started yet" if r.helper is None else f"PID {r.helper.pid} ({r.helper.comm}), " + (
        "running" if helper_proc.running(r.token, r.helper) else "gone")
    return [f"nft table {nft.FAMILY} {r.table} in netns {r.ns}: {r.direction} packets of {r.ifname} go to its "
            f"chain {nft.QUEUE_CHAIN}, whose NFQUEUE rule nft list ruleset cannot print (an xtables-compat "
            f"expression); see it: {show}",
            f"NFQUEUE {r.queue if r.queue is not None else '(not bound yet)'} in netns {r.ns}, helper {helper}; "
            f"see it: nsenter --net={r.ns} cat /proc/net/netfilter/nfnetlink_queue",
            f"stats file {r.stats}"]


class QueueStats(NamedTuple):
    """The helper's counters (its stats file, nfqueue.c's write_stats): the queue it bound; packets seen, passed
    untouched, delayed, dropped, duplicated, corrupted, reordered, refused for a full queue (overflow); held now
    and at most; its release lateness (p50, p99, max, in µs); netlink and copy errors; its scheduling ("fifo":
    realtime, else "other")."""

    queue: int
    seen: int
    passed: int
    delayed: int
    dropped: int
    duplicated: int
    corrupted: int
    reordered: int
    overflow: int
    held: int
    max_held: int
    late_p50_us: int
    late_p99_us: int
    late_max_us: int
    netlink_errors: int
    copy_errors: int
    sched: str

    def to_json(self) -> dict[str, int | str]:
        """As the helper wrote it (same keys, same order): the journal's observe details."""
        return {name: getattr(self, name) for name in self._fields}


def stats(r: QueueRecord) -> QueueStats | None:
    """The helper's counters (written every 0.5 s); read through the helper's own root where the file is not here
    (an observe helper pod: the apply helper's emptyDir is not its own)."""
    places = [Path(r.stats)]
    if r.helper is not None:
        places.append(Path(f"/proc/{r.helper.pid}/root{r.stats}"))
    for path in places:
        try:
            return QueueStats(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):  # TypeError: not the helper's keys
            continue
    return None
