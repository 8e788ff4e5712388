"""``recsys-rl features materialize``: apply the feature repo and fill one profile's online store."""

from __future__ import annotations

import argparse
import sys

from recsys_rl.cli.options import OneLineParser, add_config_option, env_default
from recsys_rl.config import load_config
from recsys_rl.logs import get_logger, log_event, new_run_id

_OFFLINE_ENV = "RECSYS_RL_FEATURES_OFFLINE"  # the repo's definitions read the same variable
_USER_TABLE_ENV = "RECSYS_RL_USER_TABLE"  # and this one
_STATE_ENV = "RECSYS_RL_FEAST_STATE_DIR"
_REDIS_ENV = "RECSYS_RL_REDIS_CONNECTION_STRING"
_EMPTY_WINDOW_FIX = "pass --start-date/--end-date to cover it, or --reset to start at its earliest row"
_PROFILES = ("sqlite", "redis")  # recsys_rl.feature_store.PROFILES; not imported here, Feast takes seconds


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "features",
        help="the Feast feature store: apply the repo, materialise to the online store",
        description="Work with the Feast feature repository (the installed one by default).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=OneLineParser)
    m = actions.add_parser(
        "materialize",
        help="apply the feature repo and materialise its offline data into the online store",
        description="Apply the feature repo's definitions to the profile's registry, then copy each "
        "feature view's latest per-entity rows from the offline Parquet (written by the feature pipeline) "
        "into the profile's online store. Each view continues where its last run stopped (its first run "
        "starts at its earliest row) and ends at its latest row, unless --start-date, --end-date or "
        "--reset say otherwise. A view that writes 0 rows in a window no earlier run reached is reported "
        "on stderr, and the exit status is still 0: an increment without new rows is legitimate "
        "(`pipeline run` fails on it instead).",
    )
    add_config_option(m)
    m.add_argument(
        "--repo",
        metavar="DIR",
        help="Feast feature repo (default: the installed one, features/ in a checkout)",
    )
    m.add_argument("--profile", choices=_PROFILES, help="online store: sqlite (embedded, default) or redis")
    m.add_argument(
        "--offline",
        metavar="DIR",
        default=env_default(_OFFLINE_ENV),
        help=f"offline root the feature pipeline wrote, one directory per view (env {_OFFLINE_ENV}; "
        "default: <repo>/data/offline)",
    )
    m.add_argument(
        "--user-table",
        metavar="DIR",
        default=env_default(_USER_TABLE_ENV),
        help=f"the platform's user table: Parquet snapshots of each account's activity group (env "
        f"{_USER_TABLE_ENV}; default: <repo>/data/user_table; `recsys-rl simulate --user-table` writes one)",
    )
    m.add_argument(
        "--state-dir",
        metavar="DIR",
        default=env_default(_STATE_ENV),
        help=f"where Feast keeps the registry and the SQLite online store (env {_STATE_ENV}; "
        "default: the repo, under data/)",
    )
    m.add_argument(
        "--redis",
        metavar="CONN",
        default=env_default(_REDIS_ENV),
        help=f"Redis for --profile redis: host:port[,db=N,password=...] or redis://URL (env {_REDIS_ENV})",
    )
    m.add_argument(
        "--start-date",
        metavar="ISO",
        help="materialise rows stamped from this date or date-time on, UTC unless an offset is given, "
        "however far earlier runs got (default: where each view's last run stopped, else its earliest row)",
    )
    m.add_argument(
        "--end-date",
        metavar="ISO",
        help="materialise rows stamped up to this date or date-time, UTC unless an offset is given "
        "(default: each view's latest row); a row is stamped with the end of its day",
    )
    m.add_argument(
        "--reset",
        action="store_true",
        default=None,
        help="ignore how far earlier runs got and write each view's rows again from its earliest one",
    )
    m.set_defaults(handler=run_materialize)


def run_materialize(args: argparse.Namespace) -> int:
    # Feast is imported on use, so that other verbs (and --help) do not pay for it.
    from recsys_rl.feature_store import MaterializeConfig, materialize_repo

    overrides = {
        "repo": args.repo,
        "profile": args.profile,
        "offline": args.offline,
        "user_table": args.user_table,
        "state_dir": args.state_dir,
        "redis": args.redis,
        "start_date": args.start_date,
        "end_date": args.end_date,
        "reset": args.reset,
    }
    config = load_config(MaterializeConfig, args.config, overrides)
    logger = get_logger("features")
    run_id = new_run_id()
    log_event(logger, "materialize_start", run_id=run_id, repo=config.repo, profile=config.profile)
    report = materialize_repo(config)
    log_event(
        logger,
        "materialize_done",
        run_id=run_id,
        apply_s=f"{report.apply_s:.2f}",
        materialize_s=f"{report.materialize_s:.2f}",
    )
    print(f"applied feature repo {config.repo} ({report.profile} profile), registry {report.registry}")
    print(f"materialised from {report.offline_root} into {report.online_store}:")
    for view in report.views:
        if view.start is None:
            print(
                f"  {view.name:<16} already materialised up to {view.end:%Y-%m-%d %H:%M:%S} UTC "
                "(--reset writes it again)"
            )
        else:
            print(
                f"  {view.name:<16} {view.entities:>9} entities, rows stamped "
                f"{view.start:%Y-%m-%d %H:%M:%S} .. {view.end:%Y-%m-%d %H:%M:%S} UTC"
            )
    for name in report.without_data:
        print(f"  {name:<16} no offline data: written by build-transitions --user-author-surface")
    for line in report.empty_windows(_EMPTY_WINDOW_FIX):
        print(f"recsys-rl features materialize: warning: {line}", file=sys.stderr)
    return 0
