"""recsys-rl: constrained reinforcement learning for a short-video recommender.

TF-Agents 0.18 needs the Keras 2 API, so TF_USE_LEGACY_KERAS must be set before anything imports
TensorFlow; importing this package first is the one place that guarantees it. So must
TF_CPP_MIN_LOG_LEVEL: at 1, TensorFlow's C++ keeps its informational lines (CPU instruction sets, a
TFRecord buffer size left to its default) to itself and still reports its warnings and errors.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

__version__ = "0.1.0"
