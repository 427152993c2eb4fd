"""The bundled eBPF sources, shipped as the package chaoskit.library.bpf (found with chaoskit.paths.library("bpf"))."""
