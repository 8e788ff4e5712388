"""``recsys-rl sim-eval`` from the command line: arguments and output (the work is in ``sim.sim_eval``)."""

from __future__ import annotations

import argparse
from typing import Any

from recsys_rl.cli.options import add_config_option, non_negative_int, positive_int
from recsys_rl.config import load_config
from recsys_rl.logs import progress_logger, quiet_native_imports


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "sim-eval",
        help="run a trained feed policy and the behaviour policy in the simulator and compare them",
        description="Run an exported feed policy and the behaviour feed policy on the same simulated "
        "world and episodes, and compare their per-signal episode values, return rates and the "
        "constraints (every auxiliary signal no worse than the behaviour's). --users and --seed together "
        "fix the world: give those of the simulated logs the policy was trained on to evaluate it on "
        "its own world.",
    )
    add_config_option(p)
    p.add_argument("--policy", metavar="RUN", help="training run directory, or an exported policy directory")
    p.add_argument("--users", type=positive_int, help="users in the world (default 2000)")
    p.add_argument("--days", type=positive_int, help="days to run, at least 2 for a return rate (default 2)")
    p.add_argument("--seed", type=non_negative_int, help="world seed of the training logs (default 0)")
    p.add_argument(
        "--episode-seed", type=non_negative_int, help="seed of the users' draws on that world (default 1)"
    )
    p.add_argument(
        "--sample",
        action="store_true",
        default=None,
        help="sample the policy's Gaussian instead of serving its mean",
    )
    p.add_argument("--out", metavar="JSON", help="also write the comparison here as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from recsys_rl.atomic_json import write_json_atomic

    with quiet_native_imports():
        from recsys_rl.sim.sim_eval import SimEvalConfig, evaluate_policy  # TensorFlow only for this verb

    overrides = {k: getattr(args, k) for k in ("policy", "users", "days", "seed", "episode_seed", "sample")}
    config = load_config(SimEvalConfig, args.config, overrides)
    report = evaluate_policy(config, progress_logger("sim_eval"))
    _print_report(report)
    if args.out:
        write_json_atomic(args.out, report)
        print(f"wrote {args.out}")
    return 0


def _print_report(report: dict[str, Any]) -> None:
    config, policy, episodes = report["config"], report["policy"], report["episodes"]
    serving = "sampled" if config["sample"] else "mean action"
    behaviour = report["behaviour"]["feed_policy"]
    print(f"policy {policy['version']} ({serving}) vs {behaviour}, {policy['directory']}")
    print(
        f"world seed {config['seed']}, {config['users']} users, {config['days']} day(s), episode seed "
        f"{config['episode_seed']}: {episodes['behaviour']} behaviour / {episodes['policy']} policy episodes"
    )
    print(f"  {'signal':<12} {'behaviour':>22} {'policy':>22} {'lift':>9}")
    for name, values in report["signals"].items():
        lift = "n/a" if values["lift"] is None else f"{100 * values['lift']:+.2f}%"
        print(f"  {name:<12} {_pm(values['behaviour']):>22} {_pm(values['policy']):>22} {lift:>9}")
    rates = report["return_rate"]
    print(f"  {'return rate':<12} {_number(rates['behaviour']):>22} {_number(rates['policy']):>22}")
    print("constraints (each auxiliary signal against the behaviour level; paired 95% interval per user):")
    for name, check in report["constraints"].items():
        low, high = check["interval"]
        margin = (
            f"margin {_number(check['margin'], '+.4g')} [{_number(low, '+.4g')}, {_number(high, '+.4g')}]"
        )
        print(f"  {name:<12} {check['bound']:<9} {check['verdict'].upper():<13} {margin}")
    broken = [name for name, check in report["constraints"].items() if not check["satisfied"]]
    print(f"  {'none broken' if not broken else 'broken: ' + ', '.join(broken)}")


def _pm(estimate: dict[str, float | None]) -> str:
    return f"{_number(estimate['mean'])} ± {_number(estimate['stderr'])}"


def _number(value: float | None, spec: str = ".4g") -> str:
    return "n/a" if value is None else format(value, spec)
