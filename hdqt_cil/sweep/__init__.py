"""Sweeps: several runs a GPU (gpu_slots), CUDA MPS for their length (mps), and, whatever the launcher, the check that
no two jobs share a run folder and the report of what failed (report). The Hydra launcher that puts gpu_slots and mps
together is hydra_plugins/hdqt_cil_launcher."""
from .report import SweepReport, record_job

__all__ = ["SweepReport", "record_job"]
