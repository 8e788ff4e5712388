"""The ``recsys-rl`` command line: one verb per job, thin wrappers over library functions.

Bad input ends the command with one line naming the problem and a non-zero exit, never a traceback:
users of a scheduled job read that line in a log, and a stack trace buries it.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Sequence

import confluent_kafka
import kafka.errors

from recsys_rl import __version__
from recsys_rl.cli import broker as broker_cmd
from recsys_rl.cli import build_transitions as build_transitions_cmd
from recsys_rl.cli import demo as demo_cmd
from recsys_rl.cli import evaluate as evaluate_cmd
from recsys_rl.cli import features as features_cmd
from recsys_rl.cli import pipeline as pipeline_cmd
from recsys_rl.cli import registry as registry_cmd
from recsys_rl.cli import serve as serve_cmd
from recsys_rl.cli import sim_eval as sim_eval_cmd
from recsys_rl.cli import simulate as simulate_cmd
from recsys_rl.cli import train as train_cmd
from recsys_rl.cli.options import EXIT_FAILURE, EXIT_USAGE, OneLineParser
from recsys_rl.config import ConfigError, read_config_file
from recsys_rl.errors import OperationalError
from recsys_rl.kafka import BrokerConfigError
from recsys_rl.logs import quiet_third_party_output
from recsys_rl.processes import Terminated, exit_on_sigterm


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="recsys-rl", description="Constrained RL for a short-video recommender.")
    # argparse exits on --version before the required verb is checked or any handler imports TensorFlow
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=OneLineParser)
    simulate_cmd.register(verbs)
    build_transitions_cmd.register(verbs)
    features_cmd.register(verbs)
    train_cmd.register(verbs)
    sim_eval_cmd.register(verbs)
    evaluate_cmd.register(verbs)
    registry_cmd.register(verbs)
    serve_cmd.register(verbs)
    pipeline_cmd.register(verbs)
    demo_cmd.register(verbs)
    broker_cmd.register(verbs)
    return parser


#: Storage failures of the machine, not of our code: a full or read-only disk, a quota, a dying device.
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def environment_failure(err: Exception) -> str | None:
    """The one line for a failure of the environment that reached the command unconverted (Kafka lost
    mid-run, a full disk: they can surface from any library call), or None for anything else."""
    if isinstance(err, kafka.errors.KafkaError | confluent_kafka.KafkaException):
        text, name = str(err), type(err).__name__
        return f"Kafka: {text if text.startswith(name) else f'{name}: {text}'}"  # kafka-python names itself
    if isinstance(err, OSError) and err.errno in _STORAGE_ERRNOS:
        where = f": {err.filename!r}" if err.filename else ""
        return f"storage: {err.strerror}{where}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    quiet_third_party_output()
    exit_on_sigterm()  # a stopped job stops the broker and servers it started (``serve`` stops its own way)
    parser = build_parser()
    # Verbs that run Beam pipelines pass the flags they do not know on to Beam's PipelineOptions.
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_pipeline_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.pipeline_args = extra
    try:
        if getattr(args, "config", None):
            read_config_file(args.config)  # a broken file fails now, before the verb imports TensorFlow
        return args.handler(args)
    except (ConfigError, BrokerConfigError) as err:
        print(f"recsys-rl {args.verb}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OperationalError as err:
        print(f"recsys-rl {args.verb}: error: {err}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as err:
        if (line := environment_failure(err)) is None:
            raise  # our bug: its traceback is what a bug report needs
        print(f"recsys-rl {args.verb}: error: {line}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"recsys-rl {args.verb}: interrupted", file=sys.stderr)
        return 130
    except Terminated as stop:
        print(f"recsys-rl {args.verb}: terminated", file=sys.stderr)
        return stop.code


if __name__ == "__main__":
    sys.exit(main())
