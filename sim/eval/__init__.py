"""Evaluation over replays: reports, corpus evaluation, statistics, tuning, fidelity."""
