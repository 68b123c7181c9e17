"""dlrm-scale's benchmarks, each run as `python -m benchmarks.NAME` from the repository root.
Every figure the docs claim comes from one of them, with its anchor measured in the same run;
each writes one current file under benchmarks/results/ that names its command, machine, date
and commit (benchmarks/common.py)."""
