"""host.memory_pressure and process.memory_limit: RAM held by a holder process, or a memory cgroup limit."""
