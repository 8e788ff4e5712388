"""``recsys-rl registry``: register, inspect, promote and roll back policy versions (``recsys_rl.registry``).

Each action names the registry with --registry (or $RECSYS_RL_REGISTRY) and the surface with
--surface; the actions that write record --actor (default $USER) in the registry's audit log.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from recsys_rl import registry
from recsys_rl.atomic_json import read_json_file
from recsys_rl.cli.options import add_config_option, env_default, table_lines
from recsys_rl.config import ConfigError, load_config, read_config_file
from recsys_rl.logs import quiet_native_imports
from recsys_rl.ope.blessing import Blessing
from recsys_rl.registry.exposure import check_exposure_fraction, check_reason

REGISTRY_ENV = "RECSYS_RL_REGISTRY"


def _argument(check: Callable[[Any], Any], convert: Callable[[str], Any] = str) -> Callable[[str], Any]:
    """An argparse type from a library check, so a bad value is a usage error naming it."""

    def parse(text: str) -> Any:
        try:
            return check(convert(text))
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text  # the check then names it as "should be a number ..., but is 'text'"


version_name = _argument(registry.check_version_name)
fraction = _argument(registry.check_fraction, _number)
exposure_fraction = _argument(check_exposure_fraction, _number)
reason = _argument(check_reason)


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "registry",
        help="register, inspect, promote and roll back policy versions",
        description="The model registry: policy versions per surface, each with its OPE report and the "
        "gate's blessing, and the routing the server follows (stable, a canary with a share of users, "
        "shadow). Stable and canary take only blessed versions; shadow, which is never served, also takes "
        "unblessed ones. Every write is atomic and recorded in REGISTRY/audit.jsonl.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    where = argparse.ArgumentParser(add_help=False)
    add_config_option(where)
    where.add_argument(
        "--registry",
        metavar="DIR",
        help=f"registry root directory (else the config's, else env {REGISTRY_ENV})",
    )
    where.add_argument("--surface", choices=registry.SURFACES, help="surface (default feed)")
    writes = argparse.ArgumentParser(add_help=False, parents=[where])
    writes.add_argument("--actor", help="who the audit log names for this write (default $USER)")

    a = actions.add_parser(
        "register",
        parents=[writes],
        help="copy a run's policy into the registry as a new version",
        description="Copy an exported policy into the registry after checking every file against its "
        "policy.json. Registering the same policy again changes nothing.",
    )
    source = a.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", metavar="RUN", help="training run directory (its manifest names the policy)")
    source.add_argument("--policy", metavar="DIR", help="exported policy directory (with policy.json)")
    a.add_argument(
        "--version", type=version_name, help="version name (default: the policy's version and its digest)"
    )
    a.add_argument("--report", metavar="DIR", help="OPE gate output to attach, as for 'attach'")
    a.set_defaults(handler=_with_settings(_register))

    a = actions.add_parser(
        "attach",
        parents=[writes],
        help="attach an OPE report and blessing to a version",
        description="Attach the OPE gate's output (report.json, blessing.json, optionally report.html) to a "
        "version. The blessing must name this version's policy sha256.",
    )
    a.add_argument("version", metavar="VERSION", type=version_name, help="a version name, as listed")
    a.add_argument("--report", metavar="DIR", required=True, help="directory the OPE gate wrote")
    a.set_defaults(handler=_with_settings(_attach))

    a = actions.add_parser(
        "list",
        parents=[where],
        help="list versions, their blessing and role",
        description="The surface's versions, oldest first, with their blessing, role, registration time and "
        "dataset. With --json, a list with each version's policy sha256 and its blessing in full: the "
        "gate's reasons and the candidate's relative lift per signal with its interval, from the "
        "attached OPE report.",
    )
    a.add_argument("--json", action="store_true", help="print the versions as a JSON list")
    a.set_defaults(handler=_with_settings(_list))

    a = actions.add_parser(
        "show", parents=[where], help="show one version: manifest, blessing, role, history"
    )
    a.add_argument("version", metavar="VERSION", type=version_name, help="a version name, as listed")
    a.set_defaults(handler=_with_settings(_show))

    a = actions.add_parser(
        "promote",
        parents=[writes],
        help="make a version stable, canary or shadow",
        description="Give a version a role. Stable and canary need a blessed version; the old stable is kept "
        "for rollback; a version leaves canary and shadow when it becomes stable.",
    )
    a.add_argument("version", metavar="VERSION", type=version_name, help="a version name, as listed")
    a.add_argument("--to", choices=registry.ROLES, required=True, help="the role")
    a.add_argument(
        "--canary-fraction", type=fraction, metavar="F", help="share of users the canary serves, in [0, 1]"
    )
    a.set_defaults(handler=_with_settings(_promote))

    a = actions.add_parser(
        "rollback",
        parents=[writes],
        help="make the previous stable version stable again",
        description="Return stable to the version it replaced (again for each further rollback), or to the "
        "blessed version given with --to.",
    )
    a.add_argument("--to", type=version_name, metavar="VERSION", help="roll back to this version instead")
    a.set_defaults(handler=_with_settings(_rollback))

    a = actions.add_parser("demote", parents=[writes], help="clear the canary or the shadow")
    a.add_argument("role", choices=("canary", "shadow"), help="the role to clear")
    a.set_defaults(handler=_with_settings(_demote))

    a = actions.add_parser(
        "approve-exposure",
        parents=[writes],
        help="let a user_author version the gate cannot judge yet serve a capped canary",
        description="The OPE gate judges a user-author term only on logs where that term served, so a new "
        "term needs a first exposure. This records who approved it and why, for at most "
        f"{registry.MAX_FIRST_EXPOSURE_FRACTION:.0%} of users; then promote it to canary within that "
        "share. Only for a version without a report: once a report is attached its blessing decides, and a "
        "refused one ends the canary.",
    )
    a.add_argument("version", metavar="VERSION", type=version_name, help="a version name, as listed")
    a.add_argument(
        "--max-canary-fraction",
        type=exposure_fraction,
        metavar="F",
        required=True,
        help=f"largest share of users the canary may serve, in (0, {registry.MAX_FIRST_EXPOSURE_FRACTION:g}]",
    )
    a.add_argument(
        "--reason", type=reason, required=True, help="why this version should be exposed (audited)"
    )
    a.set_defaults(handler=_with_settings(_approve_exposure))


@dataclass(frozen=True)
class RegistrySettings:
    """What every registry action needs, from its flags, then its --config file, then the environment."""

    registry: str = ""
    surface: str = "feed"
    actor: str = ""  # written by the actions that change the registry

    def __post_init__(self) -> None:
        if not self.registry:
            raise ValueError(
                f"registry is required: --registry DIR, 'registry:' in --config, or env {REGISTRY_ENV}"
            )
        if self.surface not in registry.SURFACES:
            raise ValueError(f"surface should be one of {list(registry.SURFACES)}, but is {self.surface!r}")


def _with_settings(action: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``action`` run with args.registry, args.surface and args.actor resolved: a flag wins, then the
    --config file, then the environment ($RECSYS_RL_REGISTRY, $USER)."""

    def run(args: argparse.Namespace) -> int:
        in_file = set(read_config_file(args.config)) if args.config else set()
        environment = {"registry": env_default(REGISTRY_ENV), "actor": env_default("USER")}
        flags = {"registry": args.registry, "surface": args.surface, "actor": getattr(args, "actor", None)}
        overrides = {k: v for k, v in environment.items() if k not in in_file}
        overrides.update({k: v for k, v in flags.items() if v is not None})
        settings = load_config(RegistrySettings, args.config, overrides)
        args.registry, args.surface, args.actor = settings.registry, settings.surface, settings.actor
        return action(args)

    return run


def _register(args: argparse.Namespace) -> int:
    with quiet_native_imports():  # the registry checks copies with policy_io, which loads TensorFlow
        importlib.import_module("recsys_rl.training.agents.policy_io")
    result = registry.register(
        args.registry,
        args.surface,
        run=args.run,
        policy=args.policy,
        version=args.version,
        report=args.report,
        actor=args.actor,
    )
    info = result.version
    if result.created:
        print(f"registered {info.surface} version {info.version} from {args.run or args.policy}")
    else:
        print(f"{info.surface} version {info.version} already holds this policy; nothing copied")
    print(f"  directory {info.directory}")
    if args.report:
        print(f"  report    {args.report} {'attached' if result.attached else 'already attached'}")
    print(f"  blessing  {_blessing_line(info)}")
    return 0


def _attach(args: argparse.Namespace) -> int:
    before = registry.read_routing(args.registry, args.surface)
    changed = registry.attach_report(args.registry, args.surface, args.version, args.report, actor=args.actor)
    info = registry.get_version(args.registry, args.surface, args.version)
    what = "attached" if changed else "already attached:"
    print(f"{what} {args.report} to {info.surface} version {info.version}")
    print(f"  blessing  {_blessing_line(info)}")
    if before.canary == info.version and registry.read_routing(args.registry, args.surface).canary is None:
        print("  canary    cleared: the gate refused the version's first exposure")
    return 0


def _approve_exposure(args: argparse.Namespace) -> int:
    changed = registry.approve_exposure(
        args.registry,
        args.surface,
        args.version,
        max_canary_fraction=args.max_canary_fraction,
        reason=args.reason,
        actor=args.actor,
    )
    info = registry.get_version(args.registry, args.surface, args.version)
    print(f"{'approved' if changed else 'already approved:'} {_exposure_line(info.exposure)}")
    print(
        f"  next: registry promote --surface {info.surface} {info.version} --to canary "
        f"--canary-fraction {info.exposure.max_canary_fraction:g}"
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    versions = registry.list_versions(args.registry, args.surface)
    routing = registry.read_routing(args.registry, args.surface)
    if args.json:
        print(json.dumps([_version_entry(info, routing) for info in versions], indent=2))
        return 0
    print(f"{args.surface} in {args.registry}: {_routing_line(routing)}")
    if not versions:
        print("  no versions registered")
        return 0
    rows = [("VERSION", "BLESSING", "ROLE", "REGISTERED", "DATASET")]
    for info in versions:
        role = routing.role_of(info.version) or "-"
        created, dataset = info.manifest["created_at"], info.manifest.get("dataset_version") or "-"
        rows.append((info.version, _status(info), role, created, dataset))
    for line in table_lines(rows):
        print("  " + line)
    return 0


def _version_entry(info: registry.VersionInfo, routing: registry.RoutingState) -> dict[str, Any]:
    """One version as ``list --json`` prints it."""
    blessing = info.blessing
    return {
        "version": info.version,
        "role": routing.role_of(info.version) or "none",
        "status": _status(info),
        "registered_at": info.manifest["created_at"],
        "dataset_version": info.manifest.get("dataset_version"),
        "policy_version": info.manifest["policy"].get("version"),
        "policy_sha256": info.policy_sha256,
        "defects": list(info.defects),
        "exposure": None if info.exposure is None else info.exposure.to_dict(),
        "blessing": None
        if blessing is None
        else {
            "passed": blessing.passed,
            "reasons": list(blessing.reasons),
            "estimator": blessing.estimator,
            "interval_method": blessing.interval_method,
            "incumbent": None if blessing.incumbent is None else blessing.incumbent.version,
            "created_at": blessing.created_at,
            "relative_lifts": _relative_lifts(info, blessing.estimator),
        },
    }


def _relative_lifts(info: registry.VersionInfo, estimator: str) -> dict[str, dict[str, Any]] | None:
    """The candidate's relative lift over the baseline per signal, with its interval, by the gating
    estimator: the figures the gate's rules read. The blessing holds only the verdict, so they come from
    the attached report; None when it holds none (an older report, or one that is not the gate's)."""
    path = info.attachment("ope_report")
    if path is None:
        return None
    report = read_json_file(path, registry.RegistryError, "the OPE report its manifest names")
    try:
        overall = report["lift"]["estimators"][estimator]["overall"]
        relative = {signal: overall[signal]["relative"] for signal in report["lift"]["signals"]}
        return {signal: {"value": e["value"], "interval": e["interval"]} for signal, e in relative.items()}
    except (KeyError, TypeError):
        return None


def _show(args: argparse.Namespace) -> int:
    info = registry.get_version(args.registry, args.surface, args.version)
    routing = registry.read_routing(args.registry, args.surface)
    manifest, source = info.manifest, info.manifest["source"]
    role = routing.role_of(info.version) or (
        "earlier stable" if info.version in routing.stable_history else "none"
    )
    print(f"{info.surface} version {info.version}")
    print(f"  role        {role}")
    print(f"  directory   {info.directory}")
    print(f"  policy      sha256 {info.policy_sha256} (policy version {manifest['policy'].get('version')})")
    print(f"  source      {'run ' + source['run'] if source.get('run') else 'policy ' + source['policy']}")
    print(f"  dataset     {manifest.get('dataset_version') or 'unknown'}")
    print(f"  registered  {manifest['created_at']}")
    blessing = info.blessing
    if blessing is None:
        print("  blessing    none attached")
    else:
        verdict = "passed" if blessing.passed else "FAILED"
        print(f"  blessing    {verdict} ({_evaluation(blessing)}) for {blessing.candidate.version}")
        for reason in blessing.reasons:
            print(f"    - {reason}")
    if info.exposure is not None:
        print(f"  exposure    {_exposure_line(info.exposure)}")
    for defect in info.defects:
        print(f"  DEFECT      {defect}")
    for key in ("ope_report", "ope_report_html"):
        if (path := info.attachment(key)) is not None:
            print(f"  report      {path}")
    print("  history")
    for record in registry.read_audit(args.registry, args.surface):
        if record.get("version") == info.version:
            print(f"    {record['time']} {record['actor']}: {_describe(record)}")
    return 0


def _promote(args: argparse.Namespace) -> int:
    if (args.to == "canary") != (args.canary_fraction is not None):
        raise ConfigError("--canary-fraction is needed with --to canary, and only with it")
    change = registry.promote(
        args.registry,
        args.surface,
        args.version,
        args.to,
        canary_fraction=args.canary_fraction,
        actor=args.actor,
    )
    _print_change(change)
    return 0


def _rollback(args: argparse.Namespace) -> int:
    _print_change(registry.rollback(args.registry, args.surface, to=args.to, actor=args.actor))
    return 0


def _demote(args: argparse.Namespace) -> int:
    _print_change(registry.demote(args.registry, args.surface, args.role, actor=args.actor))
    return 0


def _print_change(change: registry.RoutingChange) -> None:
    before, after = change.before, change.after
    if not change.changed:
        print(f"{change.surface}: nothing to change; {_routing_line(after)}")
        return
    print(f"{change.surface}: routing revision {before.revision} -> {after.revision}")
    for role in registry.ROLES:
        if getattr(before, role) != getattr(after, role):
            print(f"  {role:<8} {getattr(before, role) or '-'} -> {getattr(after, role) or '-'}")
    if before.canary_fraction != after.canary_fraction:
        print(f"  canary fraction {before.canary_fraction:g} -> {after.canary_fraction:g}")


def _routing_line(state: registry.RoutingState) -> str:
    canary = f"{state.canary} ({state.canary_fraction:.1%} of users)" if state.canary else "-"
    shadow = state.shadow or "-"
    return f"stable {state.stable or '-'}, canary {canary}, shadow {shadow} (revision {state.revision})"


def _status(info: registry.VersionInfo) -> str:
    if info.defects:
        return "DEFECTIVE"
    if info.blessing is None and info.exposure is not None:
        return f"first exposure <= {info.exposure.max_canary_fraction:.1%}"
    if info.blessing is None:
        return "unblessed"
    return "blessed" if info.blessing.passed else "refused"


def _blessing_line(info: registry.VersionInfo) -> str:
    if info.blessing is not None and info.blessed:
        return f"passed ({_evaluation(info.blessing)})"
    return f"not blessed: {info.why_not_blessed}"


def _exposure_line(exposure: registry.ExposureApproval) -> str:
    return (
        f"first exposure for at most {exposure.max_canary_fraction:.1%} of users, by {exposure.actor} at "
        f"{exposure.approved_at}: {exposure.reason}"
    )


def _evaluation(blessing: Blessing) -> str:
    return f"{blessing.estimator}, {blessing.interval_method} intervals, gate run {blessing.created_at}"


def _describe(record: dict[str, Any]) -> str:
    action = record["action"]
    if action == "attach":
        return f"attached {record['report']} (blessing {'passed' if record['passed'] else 'failed'})"
    if action == "promote":
        return f"promoted to {record['to']}"
    if action == "demote":
        return f"removed from {record['role']}"
    if action == "approve_exposure":
        return f"first exposure approved for at most {record['max_canary_fraction']:.1%}: {record['reason']}"
    return {"register": "registered", "rollback": "made stable by a rollback"}.get(action, action)
