"""Host libraries: each a narrow interface to one piece of hardware or software (NVML, DCGM, the kernel
log, sysfs and procfs readers, NCCL's RAS port, Slurm's nodes), as node_exporter's procfs and sysfs
packages are. They turn no reading into a series (docs/architecture.md).
"""
