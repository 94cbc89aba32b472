"""Results from run folders: tables and plots (`tables`), and `load_runs` for a notebook."""
from .tables import load_runs

__all__ = ["load_runs"]
