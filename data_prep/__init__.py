"""Raw HAR recordings → feature tables (NPZ) for the `hapt`, `dsads` and `pamap2` benchmarks.

Each dataset module is a command (`python -m data_prep.hapt --help`); `docs/data.md` describes the features.
"""
