"""A job record, whichever scheduler it comes from: the keys every collector and hook reads, its values bounded
(a record is input from a script or a scheduler's file, not trusted to be small)."""

from __future__ import annotations

# nccl_ras_port, nccl_ras_ports, nccl_ras_query: the job's NCCL RAS sockets on this node (the first port of its
# block and how many: one a step), and whether this node asks them (collector nccl). uid: the job's user's
# (SLURM_JOB_UID): a socket on the job's RAS port is believed only if its owner is that user (collector nccl).
# nccl_ras_nodes: the job's node count, where more than one (its other nodes spread their first query further).
KEYS = ("scheduler", "job_id", "user", "uid", "account", "gpus", "nccl_ras_port", "nccl_ras_ports", "nccl_ras_query",
        "nccl_ras_nodes")  # fmt: skip
MAX_VALUE = 256  # a label value longer than this is cut
MAX_RECORD_BYTES = 64 * 1024


def clean(value: str) -> str:
    """A record's value as a label value: printable characters only, at most MAX_VALUE of them."""
    return "".join(c for c in value if c.isprintable())[:MAX_VALUE]
