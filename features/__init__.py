"""The Feast feature repository (DESIGN 6): definitions plus one ``feature_store*.yaml`` per profile.

Installed as ``recsys_rl.feature_repo`` so that the command line finds it outside the checkout;
``recsys_rl.feature_store`` loads it. Feast runs every Python file here, this one included (it defines
nothing).
"""

from pathlib import Path

#: This repository's directory, wherever it was installed: the default repo of every command.
REPO_DIR = Path(__file__).resolve().parent
