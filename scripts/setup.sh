#!/usr/bin/env bash
# Idempotent set-up: system packages, kernel mounts, headers symlink, .venv with chaoskit, the Triton engine.
# Only does what is missing; safe to run again and again.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
APT_PKGS=(nftables iproute2 python3-bpfcc linux-headers-amd64 prometheus prometheus-pushgateway prometheus-alertmanager gcc libc6-dev chromium tmux)

log() { printf '[setup] %s\n' "$*"; }

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # Node and npm (ajv, installed below, checks the published JSON Schema in strict mode): Debian's nodejs and npm
  # where the commands are missing (a NodeSource nodejs brings its own npm and conflicts with Debian's)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # bcc needs kernel headers; none match this kernel, Debian's generic ones work (see ARCHITECTURE.md).
  kdir="/lib/modules/$(uname -r)"
  if [ ! -e "$kdir/build" ]; then
    hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1 || true)
    common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1 || true)
    if [ -n "$hdr" ] && [ -n "$common" ]; then
      log "linking kernel headers $hdr -> $kdir/build"
      mkdir -p "$kdir"
      ln -sfn "$hdr" "$kdir/build"
      ln -sfn "$common" "$kdir/source"
    fi
  fi
  if [ -d /sys/kernel/tracing ] && ! mountpoint -q /sys/kernel/tracing; then
    log "mounting tracefs on /sys/kernel/tracing"
    mount -t tracefs nodev /sys/kernel/tracing || log "warning: could not mount tracefs"
  fi
else
  log "not root or no apt-get: skipping system packages (eBPF/network tests will skip with a reason)"
fi

stamp=.venv/.chaoskit-installed
want=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)  # what the editable install was made from
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing chaoskit and its dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q -e '.[dev]'
  echo "$want" > "$stamp"
fi
# The reference Triton engine (the real tritonserver of the nvidia-pytriton wheel), as a user installs it:
# once into .chaoskit/triton, then "already installed".
.venv/bin/chaoskit ref install triton
# ajv, the JSON Schema validator most editors and CI tools use: tests check the published schema in its strict mode.
if command -v npm >/dev/null && [ ! -d .chaoskit/npm/node_modules/ajv ]; then
  log "installing ajv@8 into .chaoskit/npm (strict check of the published schema)"
  npm install --silent --no-audit --no-fund --prefix .chaoskit/npm ajv@8 >/dev/null \
    || log "warning: npm install ajv@8 failed; the schema's ajv test will say so"
fi
log "ready"
