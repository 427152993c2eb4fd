"""process.cpu_throttle and host.cpu_stress: CPU time capped by a cgroup, or taken by busy workers."""
