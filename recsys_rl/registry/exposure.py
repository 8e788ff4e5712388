"""A first-exposure approval: someone's audited decision to let a version the gate has not judged serve
a capped share of users as canary.

Why it exists: the OPE gate judges a user-author term only on logs where that same term was served
(``recsys_rl.ope.logged``: the weight logit's propensity and each candidate's term are the term's own),
so a new term has no evidence until it has served, and "serve only blessed versions" would keep every
new term out for good. The approval is the narrow way in (``layout.FIRST_EXPOSURE_SURFACES``): it names
the weights it approves (their sha256, like a blessing), the largest canary share (at most
``layout.MAX_FIRST_EXPOSURE_FRACTION``), who decided and why. It stands in for a blessing only until the
gate has spoken: once a report is attached, the blessing alone decides (``VersionInfo.why_not_servable``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recsys_rl.atomic_json import read_json_file
from recsys_rl.registry.layout import MAX_FIRST_EXPOSURE_FRACTION, RegistryError


@dataclass(frozen=True)
class ExposureApproval:
    policy_sha256: str  # the weights approved; another policy under the version is not
    max_canary_fraction: float  # in (0, MAX_FIRST_EXPOSURE_FRACTION]
    reason: str
    actor: str
    approved_at: str

    def __post_init__(self) -> None:
        check_exposure_fraction(self.max_canary_fraction)
        check_reason(self.reason)
        for name in ("policy_sha256", "actor", "approved_at"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} should be a non-empty string, but is {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_exposure_fraction(value: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and 0.0 < value <= MAX_FIRST_EXPOSURE_FRACTION)
    ):
        raise ValueError(
            f"max_canary_fraction should be in (0, {MAX_FIRST_EXPOSURE_FRACTION:g}] (a first exposure "
            f"reaches few users), but is {value!r}"
        )
    return float(value)


def check_reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"reason should say why this version should be exposed, but is {reason!r}")
    return reason


def read_exposure(path: Path) -> ExposureApproval:
    """The approval stored at ``path``; RegistryError naming the file when it is not one."""
    data = read_json_file(path, RegistryError, "no exposure approval")
    names = set(ExposureApproval.__dataclass_fields__)
    if not isinstance(data, dict) or set(data) != names:
        raise RegistryError(f"{path} is not an exposure approval: it should hold exactly {sorted(names)}")
    try:
        return ExposureApproval(**data)
    except ValueError as err:
        raise RegistryError(f"{path} is not a valid exposure approval: {err}") from None
