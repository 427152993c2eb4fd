"""The run's proxy forkserver: one process that imported the proxy servers forks each proxy helper."""
