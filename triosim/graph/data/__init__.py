"""Data parallelism: gradient synchronisation (DDP buckets, the whole gradient after backward),
ZeRO's sharding of optimizer state, gradients and parameters, and the cases 1 and 2 components."""
