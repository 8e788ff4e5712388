"""Offline constrained actor-critic agents (TF-Agents) for the feed surface: TSCAC and its baselines."""
