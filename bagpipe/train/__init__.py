"""Training: configuration, the shared step, the loop over embedding backends, metrics, checkpoints."""
