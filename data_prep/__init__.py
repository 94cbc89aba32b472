"""Raw HAR recordings → feature tables (NPZ) for the `hapt`, `dsads` and `pamap2` benchmarks.

Each dataset module is a command (`python -m data_prep.hapt --help`) that reads the release archive as it is, or an
unpacked folder, and checks its files against the per-file sha256 list beside the archive when there is one
(`sources.release_root`); `docs/data.md` describes the checks and the features.
"""
