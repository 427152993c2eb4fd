"""GPU access for the GPU faults and probes: CUDA driver (cuda.py) and NVML (nvml.py), one thin module each."""
