"""Resolve what a fault acts on: processes (and later netns, cgroups, block devices, pods)."""
