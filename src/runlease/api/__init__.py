"""The HTTP control plane: enqueue, read, cancel, event streams, dead letters."""
