#!/usr/bin/env bash
# GPU check (<= 5 minutes) for a machine with a GPU: every gpu.memory_pressure mode for real, NVML agreement,
# steady-hold error against a bursting neighbour, allocation speed vs a raw cuMemAlloc loop, the largest
# allocation after fragmenting, gpu.mig in plan mode only. Changes no card setting (no MIG mode/layout,
# clocks, power limits, resets). Last line: RESULT hold_error=... nvml_agreement=... alloc_s_per_gib=...
# frag_largest_ratio=... (keys explained in bench/gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3   # a bare GPU machine: the GPU path needs only the stdlib (+ pynvml if present)
nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,mig.mode.current --format=csv 2>/dev/null || true
exec timeout 300 "$PY" bench/gpu_check.py
