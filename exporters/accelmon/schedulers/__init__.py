"""The scheduler integrations: Slurm's and OAR's health hooks, Slurm's drain and repair loop. They adapt
the scheduler's types to the health folder's policy, never the other way round
(docs/architecture.md).
"""
