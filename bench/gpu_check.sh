#!/usr/bin/env bash
# GPU check (<= 7 minutes) for a machine with a GPU. bench/gpu_check.py: every gpu.memory_pressure mode for real,
# NVML agreement, steady-hold error against a bursting neighbour, allocation speed vs a raw cuMemAlloc loop, the
# largest allocation after fragmenting, gpu.mig in plan mode only. bench/cuda_fault_check.py: gpu.cuda_fault's
# interposer against the real driver and PyTorch. Changes no card setting (no MIG mode/layout, clocks, power
# limits, resets). Each prints its RESULT line (keys explained in the scripts).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3   # a bare GPU machine: stdlib, pydantic for the injector parts (+ pynvml, torch if present)
nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,mig.mode.current --format=csv 2>/dev/null || true
rc=0
timeout 300 "$PY" bench/gpu_check.py || rc=$?
timeout 120 "$PY" bench/cuda_fault_check.py || rc=$?
exit $rc
