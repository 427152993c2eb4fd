"""The GPU faults: gpu.memory_pressure (and its holder), gpu.xid, gpu.cuda_fault, gpu.mig."""
