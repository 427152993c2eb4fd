"""process.signal: signals to processes chosen by PID, name or parent; the process selection the cgroup faults share."""
