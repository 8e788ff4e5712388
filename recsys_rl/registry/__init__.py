"""The model registry: versioned policies per surface, the OPE evidence for each, and what is served.

Layout on a filesystem path (DESIGN 10)::

    REGISTRY/
      .lock                                 writers hold an exclusive flock on it, one at a time
      audit.jsonl                           one JSON line per write, all surfaces: time, actor, action, ...
      <surface>/                            feed, live_allocation or user_author
        routing.json                        stable, canary + canary_fraction, shadow, revision, ...
        versions/<version>/
          manifest.json                     version, surface, policy sha256, source run, dataset version
          policy/                           a verified copy of the exported policy
          ope/report.json, ope/report.html  the OPE report the gate judged, once attached
          blessing.json                     the gate's verdict (``recsys_rl.ope.blessing``), once attached
          exposure.json                     a first-exposure approval (``exposure``), user_author only
        .staging/                           writes in progress; never read, swept by the next writer

Readers take no lock and never see a partial write. A version directory is assembled under
``.staging/`` and renamed into ``versions/`` in one step, so it is listed whole or not at all, and its
policy never changes afterwards. ``routing.json``, manifests and attached files are written to a
temporary sibling and renamed over the old file. Writers serialise on ``.lock``. A writer killed midway
leaves debris only under ``.staging/`` (swept by the next writer) or in a temporary sibling: the
registry reads exactly as it did before. The server polls ``routing.json`` through
``resolve_routing`` and sees each revision whole.

Roles and blessings:

* stable and canary serve users, so they take only a *blessed* version: its blessing passed and names
  this version's weights (``candidate.policy_sha256`` is the digest of the stored ``policy.json``,
  which still has the digest recorded at registration).
* shadow is computed and logged but never served, so it also takes a version without a blessing or
  with a failed one: watching a candidate on live traffic is how evidence is gathered. It still refuses
  a version with defects (a blessing for other weights, a changed ``policy.json``), which mean tampering
  rather than missing evidence. ``resolve_routing`` returns each role's ``VersionInfo``, whose
  ``why_not_servable`` is the rule the registry promotes by and the server loads by, so the server
  holds to it whatever the routing file says.
* A first exposure (``exposure``; ``layout.FIRST_EXPOSURE_SURFACES``, today user_author): the gate can
  judge a user-author term only on logs where that term served, so a version it cannot judge yet may
  serve as canary on an audited approval (who, why, at most ``MAX_FIRST_EXPOSURE_FRACTION`` of users)
  instead of a blessing, within the share approved. Once a report is attached its blessing alone
  decides; a refused one attached to the canary also clears it.
* A version holds one role at a time: becoming stable takes it out of canary and shadow, becoming
  canary takes it out of shadow. A canary needs a stable version to split traffic with, except on
  user_author, whose fallback (no term) is the control; users go to the canary by ``arm_for_user``, a
  hash of their id.
* ``routing.json`` keeps the earlier stable versions (``stable_history``): ``rollback`` returns to the
  last of them and drops it, so repeated rollbacks walk back through the releases.

An attached report and blessing can be replaced (the gate rerun on more data), except on a version that
serves as stable or canary: its evidence must not change under it. Identical repeats of ``register`` and
``attach_report`` change nothing and are not audited; every other write appends one audit line after it
commits (a writer killed between the two leaves the change unrecorded; the window is one rename long).

The parts: ``layout`` (file names, surfaces, roles and the checks on names), ``audit`` (the lock, staging
and the audit log every write goes through), ``versions`` (register, attach evidence or approve a first
exposure, list, read), ``exposure`` (the approval record),
``routing_file`` (``routing.json`` as a record), ``routing`` (promote, roll back, demote, resolve) and
``policy_files`` (what identifies an exported policy on disk). This module is the registry's public API.
"""

from recsys_rl.registry.audit import read_audit
from recsys_rl.registry.exposure import ExposureApproval
from recsys_rl.registry.layout import (
    MAX_FIRST_EXPOSURE_FRACTION,
    ROLES,
    SERVING_ROLES,
    SURFACES,
    RegistryError,
    check_fraction,
    check_surface,
    check_version_name,
)
from recsys_rl.registry.routing import (
    Routing,
    RoutingChange,
    arm_for_user,
    demote,
    promote,
    resolve_routing,
    rollback,
)
from recsys_rl.registry.routing_file import RoutingState, read_routing
from recsys_rl.registry.versions import (
    Registered,
    VersionInfo,
    approve_exposure,
    attach_report,
    get_version,
    list_versions,
    register,
)

__all__ = [
    "MAX_FIRST_EXPOSURE_FRACTION",
    "ROLES",
    "SERVING_ROLES",
    "SURFACES",
    "ExposureApproval",
    "Registered",
    "RegistryError",
    "Routing",
    "RoutingChange",
    "RoutingState",
    "VersionInfo",
    "approve_exposure",
    "arm_for_user",
    "attach_report",
    "check_fraction",
    "check_surface",
    "check_version_name",
    "demote",
    "get_version",
    "list_versions",
    "promote",
    "read_audit",
    "read_routing",
    "register",
    "resolve_routing",
    "rollback",
]
