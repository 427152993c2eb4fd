"""disk.throttle and disk.fill: cgroup I/O limits on a disk, a filesystem filled by a real file."""
