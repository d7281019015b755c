"""Synthetic clusters and workloads, written as sacct dumps."""
