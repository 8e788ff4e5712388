"""recsys-rl: constrained reinforcement learning for a short-video recommender.

TF-Agents 0.18 needs the Keras 2 API, so TF_USE_LEGACY_KERAS must be set before anything imports
TensorFlow; importing this package first is the one place that guarantees it.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"
