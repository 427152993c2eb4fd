"""The library bundled with chaoskit: experiments, probes, fault steps, matrices and eBPF sources, one subpackage
each (chaoskit.library.KIND). Their files live at the top of the source tree (experiments/, probes/, faults/,
matrices/, bpf/); setup.py maps each folder to its subpackage, so an installed wheel and an editable install
both find them with importlib.resources (chaoskit/paths.py library())."""
