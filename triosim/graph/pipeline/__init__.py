"""Pipeline parallelism: stage partitions (count, time, optimal with re-timed candidates), the
block orders of GPipe, 1F1B and interleaved 1F1B, a pipeline rank's program, stage-to-stage sends,
and the original's pipeline replay under ``--reference-compat``."""
