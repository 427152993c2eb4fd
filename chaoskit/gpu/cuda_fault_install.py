"""`python -m chaoskit.gpu.cuda_fault_install DIR`: put the CUDA fault interposer and a disarmed control file in DIR.

What the init container of a Deployment prepared by `chaoskit cuda-wrap --deployment` runs (the chaoskit image):
DIR is a volume the pod's GPU containers mount at the same path, loading DIR/LIBRARY (LD_PRELOAD) and mapping
DIR/control ($CHAOSKIT_CUDA_FAULT). The library is the one built into the image (PREBUILT, or
$CHAOSKIT_CUDA_FAULT_LIB), else it is compiled here. Both files are readable, and the control file writable, by
every user: the app containers may run as any user, and the helper pod that arms it holds no DAC capability.
Standard library only.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from chaoskit.gpu import cuda_fault_ctl as ctl

MOUNT = "/chaoskit-cuda"  # where the volume is mounted, in the init container and the GPU containers alike
LIBRARY = "libchaoskit-cudafault.so"
CONTROL = "control"
PREBUILT = Path("/usr/local/lib/chaoskit") / LIBRARY  # built at image build time (deploy/k8s/chaoskit/Dockerfile)
LIB_ENV = "CHAOSKIT_CUDA_FAULT_LIB"


def library() -> Path:
    """The interposer to copy: $CHAOSKIT_CUDA_FAULT_LIB, else the image's, else compiled now (cbuild errors)."""
    given = os.environ.get(LIB_ENV)
    if given:
        return Path(given)
    return PREBUILT if PREBUILT.is_file() else ctl.build()


def install(directory: Path) -> tuple[Path, Path]:
    """(library, control file) in `directory`: the library copied (mode 0644), the control file created
    disarmed (mode 0666; one that exists is kept: a restarted init container finds it mapped by nobody yet)."""
    directory.mkdir(parents=True, exist_ok=True)
    lib = directory / LIBRARY
    tmp = lib.with_suffix(".tmp")
    shutil.copyfile(library(), tmp)
    tmp.chmod(0o644)
    tmp.replace(lib)
    control = directory / CONTROL
    if not control.exists():
        ctl.create(control)
    control.chmod(0o666)
    return lib, control


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m chaoskit.gpu.cuda_fault_install DIR", file=sys.stderr)
        return 2
    try:
        lib, control = install(Path(argv[0]))
    except Exception as e:  # one line in the init container's log
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"installed {lib} and {control} (disarmed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
