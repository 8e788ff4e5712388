"""Training: the offline agents and ``recsys-rl train``, which runs one of them into a run directory.

``agents`` holds the TF-Agents implementations (TSCAC, SL-MGAC and the baselines), their networks,
losses, dataset reader and policy export; ``train`` is the run: config, data manifest, metrics and
exported policy.
"""
