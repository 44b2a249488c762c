"""Per-GPU memory plans: residency, prefetch and eviction of a program's buffers, and a pipeline
stage's occupancy by weights, gradients, optimizer state and activations."""
