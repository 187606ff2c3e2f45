"""Drills: rehearsals of a fault (accelmon-drill) and the NCCL drill, above the collectors and the scan
(docs/architecture.md).
"""
