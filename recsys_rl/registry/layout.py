"""What a registry directory holds and which names it accepts: file names, surfaces, roles, checks.

The layout itself, and the guarantees readers and writers rely on, are in the package docstring.
"""

from __future__ import annotations

import re
from pathlib import Path

from recsys_rl.errors import OperationalError

#: The routed surfaces: feed ranking, live allocation, and the user-author term that adds to a feed
#: ranking's scores (issue 22), each with its own versions and routing.
SURFACES = ("feed", "live_allocation", "user_author")


ROLES = ("stable", "canary", "shadow")


SERVING_ROLES = ("stable", "canary")


#: Surfaces whose fallback is a control arm a canary can split traffic with, and whose versions may first
#: serve on an exposure approval. The fallback of user_author adds no term: the ranking without it. And
#: the OPE gate can judge a term only on logs of that same term (its propensities and values are the
#: term's), so a new term has no evidence until it has served somewhere: a capped, audited first exposure
#: is the only way in. Feed and live allocation versions share their action space with every log.
FIRST_EXPOSURE_SURFACES = ("user_author",)


#: The largest share of users a first exposure may reach before the gate has judged the version.
MAX_FIRST_EXPOSURE_FRACTION = 0.05


SCHEMA_VERSION = 1


VERSION_MANIFEST = "manifest.json"


ROUTING_FILE = "routing.json"


AUDIT_LOG = "audit.jsonl"


LOCK_FILE = ".lock"


STAGING = ".staging"


BLESSING_FILE = "blessing.json"


EXPOSURE_FILE = "exposure.json"


#: The manifest keys that point at attached files, and where the files go inside a version directory.
ATTACHMENTS = {
    "ope_report": "ope/report.json",
    "ope_report_html": "ope/report.html",
    "blessing": BLESSING_FILE,
}


#: A writer that cannot get the lock in this time fails with a message instead of hanging a job forever.
LOCK_TIMEOUT_S = 60.0


_VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class RegistryError(OperationalError):
    """A registry operation that cannot be done as asked; the message names the surface, version or file."""


def check_surface(surface: str) -> str:
    if surface not in SURFACES:
        raise ValueError(f"surface should be one of {list(SURFACES)}, but is {surface!r}")
    return surface


def check_version_name(version: str) -> str:
    """Version names become directory names: letters, digits, '.', '_' and '-' only."""
    if not isinstance(version, str) or not _VERSION_NAME.fullmatch(version):
        raise ValueError(
            "a version should be 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit, "
            f"but is {version!r}"
        )
    return version


def check_fraction(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"canary_fraction should be a number in [0, 1], but is {value!r}")
    return float(value)


def open_registry(registry: str | Path) -> Path:
    root = Path(registry)
    if not root.is_dir():
        raise RegistryError(f"no registry at {root} (registering a policy creates one)")
    return root


def versions_path(root: Path, surface: str) -> Path:
    return root / check_surface(surface) / "versions"
