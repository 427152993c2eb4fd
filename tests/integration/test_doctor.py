"""`chaoskit doctor`: each check agrees with the host (found out here without chaoskit's code), a missing
capability names what provides it on Debian/Ubuntu and on RHEL, and `--fix` runs, prints or refuses as it should.
Nothing here installs a package: the one thing --fix really does is mount tracefs in a private mount namespace."""

from __future__ import annotations

import ctypes.util
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaoskit import doctor, doctor_fix
from tests.conftest import ROOT

KERNEL = os.uname().release
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="doctor's kernel checks, setpriv and unshare need root")


def cli(*args: str, env: dict[str, str | None] | None = None, prefix: list[str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """`chaoskit ARGS` with os.environ updated by `env` (a None value removes the variable)."""
    full = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run([*(prefix or []), sys.executable, "-m", "chaoskit", *args], capture_output=True, text=True,
                          env=full, cwd=ROOT, timeout=timeout)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A home and state dir that user nobody can write (pytest's tmp_path is root's only)."""
    d = Path(tempfile.mkdtemp(prefix="chaoskit-doctor-"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def nobody_env(d: Path) -> dict[str, str]:
    return {"HOME": str(d), "CHAOSKIT_STATE_DIR": str(d / "state"), "CHAOSKIT_CACHE_DIR": str(d / "cache")}


# ---------------------------------------------------------------- the host, found out independently

def has_netem() -> bool:
    """sch_netem loaded, a module of this kernel (modprobe finds it, or its file is there), or built in."""
    if Path("/sys/module/sch_netem").exists() or list(Path(f"/lib/modules/{KERNEL}").rglob("sch_netem.ko*")):
        return True
    modprobe = shutil.which("modprobe", path=f"{os.environ.get('PATH', '')}:/sbin:/usr/sbin")
    if modprobe and subprocess.run([modprobe, "--dry-run", "sch_netem"], capture_output=True).returncode == 0:
        return True
    try:
        return "CONFIG_NET_SCH_NETEM=y" in gzip.decompress(Path("/proc/config.gz").read_bytes()).decode()
    except OSError:
        return False


def has_queue_mode() -> bool:
    """network.netem's queue mode can run: the kernel config has the NFQUEUE options and a C compiler is here."""
    try:
        config = gzip.decompress(Path("/proc/config.gz").read_bytes()).decode()
    except OSError:
        return False
    options = ("NETFILTER_NETLINK_QUEUE", "NETFILTER_XT_TARGET_NFQUEUE", "NFT_COMPAT")
    return has_compiler() and all(f"CONFIG_{o}=y" in config or f"CONFIG_{o}=m" in config for o in options)


def has_compiler() -> bool:
    return bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))


def has_nft() -> bool:
    nft = shutil.which("nft")
    return bool(nft) and subprocess.run([nft, "list", "tables"], capture_output=True).returncode == 0


def has_ebpf() -> bool:
    """root, tracefs mounted, headers for this kernel, and the system python imports bcc."""
    mounted = any(line.split()[1:3] == ["/sys/kernel/tracing", "tracefs"]
                  for line in Path("/proc/mounts").read_text().splitlines())
    imports = subprocess.run(["/usr/bin/python3", "-c", "import bcc"], capture_output=True).returncode == 0
    return os.geteuid() == 0 and mounted and Path(f"/lib/modules/{KERNEL}/build").exists() and imports


def has_cuda() -> bool:
    return ctypes.util.find_library("cuda") is not None or Path("/dev/nvidiactl").exists()


def has_kubeconfig() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) or Path(
        os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config")).exists()


@root_only
def test_json_checks_agree_with_the_host():
    p = cli("doctor", "--json")
    assert p.returncode == 0, p.stderr
    checks = {c["area"]: c for c in json.loads(p.stdout)}
    truth = {"root": os.geteuid() == 0, "network.netem (kernel)": has_netem() or has_queue_mode(),
             "load sender (native)": has_compiler(), "nftables (network.drop/partition)": has_nft(),
             "eBPF probes (bcc)": has_ebpf(), "GPU memory pressure (CUDA driver)": has_cuda(),
             "Kubernetes": has_kubeconfig()}
    assert {area: checks[area]["ok"] for area in truth} == truth
    for c in checks.values():
        assert set(c) == {"area", "ok", "detail", "blocks", "missing"} and c["detail"] and c["blocks"]
        assert c["ok"] or c["missing"] or c["area"] == "watchdog survives a whole-job kill", c
        for m in c["missing"]:
            assert m["remedy"] and set(m) >= {"id", "what", "debian", "rhel", "kernel_option", "installable"}
    if not truth["network.netem (kernel)"]:
        [netem] = checks["network.netem (kernel)"]["missing"]
        assert netem["debian"] == [f"linux-modules-extra-{KERNEL}"]
        assert netem["rhel"] == [f"kernel-modules-extra-{KERNEL}"]


def test_the_remedy_table_names_both_package_families():
    want = {"bcc": (["python3-bpfcc"], ["bcc-tools", "python3-bcc"]),
            "kernel-headers": ([f"linux-headers-{KERNEL}"], [f"kernel-devel-{KERNEL}"]),
            "nftables": (["nftables"], ["nftables"]),
            "cc": (["gcc", "libc6-dev"], ["gcc", "glibc-devel"]),
            "netem": ([f"linux-modules-extra-{KERNEL}"], [f"kernel-modules-extra-{KERNEL}"]),
            "nvidia-driver": (["nvidia-driver", "libcuda1", "libnvidia-ml1"],
                              ["nvidia-driver", "nvidia-driver-cuda-libs", "nvidia-driver-NVML"])}
    for rid, (debian, rhel) in want.items():
        req = doctor.REQUIREMENTS[rid]
        assert (req.packages("debian"), req.packages("rhel")) == (debian, rhel), rid
        assert f"Debian/Ubuntu: apt-get install {' '.join(debian)}" in req.remedy()
        assert f"RHEL-family: dnf install {' '.join(rhel)}" in req.remedy()
    assert "CONFIG_NET_SCH_NETEM" in doctor.REQUIREMENTS["netem"].remedy()
    assert "mount -t tracefs nodev /sys/kernel/tracing" in doctor.REQUIREMENTS["tracefs"].remedy()
    site = doctor.REQUIREMENTS["bcc-site"].remedy()
    assert "venv --system-site-packages" in site and "pipx install --system-site-packages" in site


@root_only
@pytest.mark.skipif(has_netem() or not has_queue_mode(), reason="for a kernel without sch_netem but with NFQUEUE")
def test_without_sch_netem_the_table_says_network_netem_uses_queue_mode():
    p = cli("doctor", "--json")
    (netem,) = [c for c in json.loads(p.stdout) if c["area"] == "network.netem (kernel)"]
    assert netem["ok"] and netem["missing"] == [], netem
    assert "built without sch_netem" in netem["detail"] and "network.netem uses mode queue" in netem["detail"]


@root_only
@pytest.mark.skipif(has_netem() or has_queue_mode(), reason="network.netem runs here (sch_netem or queue mode)")
def test_the_table_says_what_provides_sch_netem_and_what_it_blocks():
    p = cli("doctor")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    i = lines.index("✗ network.netem (kernel) — blocks network.netem")
    assert lines[i + 1].startswith("    needs the sch_netem qdisc: ")
    assert f"apt-get install linux-modules-extra-{KERNEL}" in lines[i + 1]
    assert f"dnf install kernel-modules-extra-{KERNEL}" in lines[i + 1]


def test_bcc_installed_system_wide_but_not_importable_here():
    """An interpreter that cannot import bcc (a venv without system site packages: here, one with `bcc` blocked)
    while the distribution's bcc is on disk: doctor says so, and how to make it visible."""
    found = doctor.system_bcc()
    if found is None:
        pytest.skip("no system-wide bcc on this host")
    code = ("import sys, json; sys.modules['bcc'] = None\n"
            "from chaoskit import doctor; print(json.dumps(doctor.bcc_state()))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    missing, detail = json.loads(p.stdout)
    assert missing == "bcc-site" and f"bcc is installed at {found}, but {sys.executable} cannot import it" in detail
    missing, detail = doctor.bcc_state()  # this interpreter: the real import
    assert missing is None and detail.startswith("bcc ")


# ---------------------------------------------------------------- --fix

@root_only
def test_fix_without_root_prints_the_commands_and_exits_non_zero(open_dir):
    """tracefs unmounted in a private mount namespace: the fix is a command, which user nobody cannot run."""
    script = f"umount /sys/kernel/tracing && exec {' '.join(AS_NOBODY)} {sys.executable} -m chaoskit doctor --fix"
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, env={**os.environ, **nobody_env(open_dir)}, cwd=ROOT, timeout=120)
    assert p.returncode == 4, p.stdout + p.stderr
    assert "  $ mount -t tracefs nodev /sys/kernel/tracing" in p.stdout
    assert "error: doctor --fix needs root: run the commands above as root, or `sudo chaoskit doctor --fix`" in p.stderr
    assert "Traceback" not in p.stderr
    plain = cli("doctor", "--fix", env=nobody_env(open_dir), prefix=AS_NOBODY)  # nothing to install: still refused
    assert plain.returncode == 4 and "error: doctor --fix needs root" in plain.stderr, plain.stdout + plain.stderr


@root_only
def test_fix_as_root_runs_the_commands():
    script = f"umount /sys/kernel/tracing && {sys.executable} -m chaoskit doctor --fix && grep tracefs /proc/self/mounts"
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "  $ mount -t tracefs nodev /sys/kernel/tracing" in p.stdout  # the plan
    assert "\n$ mount -t tracefs nodev /sys/kernel/tracing\n" in p.stdout  # and its run
    done = next(line for line in p.stdout.splitlines() if line.startswith("done"))
    assert "eBPF" not in done and "nodev /sys/kernel/tracing tracefs" in p.stdout


APT_STATE = ("/var/lib/dpkg/status", "/var/lib/apt/lists", "/var/log/apt/history.log", "/var/log/dpkg.log")


def apt_state() -> dict[str, float | None]:
    return {p: (os.stat(p).st_mtime if os.path.exists(p) else None) for p in APT_STATE}


@root_only
@pytest.mark.skipif(not shutil.which("apt-get"), reason="not an apt host")
def test_fix_as_root_installs_nothing_when_no_package_can_help():
    """Everything apt could install is installed (asked of dpkg here) and tracefs is mounted: the plan is empty,
    and --fix runs nothing — whatever else is missing (sch_netem of a kernel no package built)."""
    wanted = [p for rid in ("bcc", "nftables", "cc") for p in doctor.REQUIREMENTS[rid].packages("debian")]
    absent = [p for p in wanted if "install ok installed" not in subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True).stdout]
    packaged = subprocess.run(["dpkg-query", "-S", f"/boot/vmlinuz-{KERNEL}"], capture_output=True).returncode == 0
    if absent or packaged or not has_ebpf():
        pytest.skip(f"not the host this test is for (absent: {absent}, packaged kernel: {packaged})")
    assert doctor_fix.plan(doctor.run_checks()).commands() == []  # else --fix below would install something
    before = apt_state()
    p = cli("doctor", "--fix")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "doctor --fix: nothing for it to install here" in p.stdout and "$ " not in p.stdout
    if not (has_netem() or has_queue_mode()):
        assert (f"the sch_netem qdisc (network.netem (kernel)): no Debian/Ubuntu package provides it for kernel "
                f"{KERNEL}") in p.stdout
    assert apt_state() == before


def native_sender_check(env: dict[str, str | None]) -> dict:
    p = cli("doctor", "--json", env=env)
    return next(c for c in json.loads(p.stdout) if c["area"] == "load sender (native)")


@root_only
def test_fix_on_a_host_without_apt_prints_the_rhel_commands_and_runs_none():
    """No apt-get (nor a C compiler) on PATH: the native sender's check fails for real, and --fix prints dnf."""
    env: dict[str, str | None] = {"PATH": "/nonexistent", "CC": None}
    sender = native_sender_check(env)
    assert not sender["ok"] and [m["id"] for m in sender["missing"]] == ["cc"]
    assert sender["detail"].startswith("no C compiler ($CC, cc or gcc on PATH): the native sender cannot compile")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:  # a compiler that cannot run its assembler (not on PATH) cannot compile either
        broken = native_sender_check({**env, "CC": cc})
        assert not broken["ok"] and [m["id"] for m in broken["missing"]] == ["cc"]
        assert broken["detail"].startswith(f"{cc} fails: ") and "cannot compile" in broken["detail"], broken
    p = cli("doctor", "--fix", env=env)
    assert p.returncode == 4, p.stdout + p.stderr
    assert "doctor --fix (RHEL-family commands):\n  $ dnf install -y gcc glibc-devel\n" in p.stdout
    assert "needs a C compiler and the C library's headers: Debian/Ubuntu: apt-get install gcc libc6-dev; " \
           "RHEL-family: dnf install gcc glibc-devel" in p.stdout
    assert "error: this host has no apt-get, and doctor --fix runs apt-get only (not dnf)" in p.stderr


def test_a_planned_package_that_is_not_installed(monkeypatch):
    """plan(): a requirement whose package dpkg does not have becomes apt-get update + install; an installed one
    becomes a line saying it is installed yet the check fails."""
    if doctor_fix.host_family() != "debian":
        pytest.skip("not an apt host")
    monkeypatch.setitem(doctor.REQUIREMENTS, "t-absent", doctor.Requirement("t-absent", "x", debian=("chaoskit-none",)))
    monkeypatch.setitem(doctor.REQUIREMENTS, "t-there", doctor.Requirement("t-there", "y", debian=("dpkg",)))
    fp = doctor_fix.plan([doctor.Check("a", False, "broken", missing=("t-absent", "t-there"))])
    assert fp.commands() == [["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends",
                                                    "chaoskit-none"]]
    assert fp.manual == ["y (a): dpkg installed, yet: broken"]


def test_run_stops_at_the_first_failing_command():
    fp = doctor_fix.FixPlan("debian", extra=[["true"], ["false"], ["touch", "/nonexistent/never"]])
    said: list[str] = []
    with pytest.raises(doctor_fix.PreflightError, match=r"`false` failed \(exit 1\); nothing after it was run"):
        doctor_fix.run(fp, said.append)
    assert said == ["$ true", "$ false"]
