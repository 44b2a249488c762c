"""Tensor parallelism: Megatron plans (column- then row-parallel pairs, sequence parallel), the
per-op scheme for CNN traces, and the collectives a plan adds."""
