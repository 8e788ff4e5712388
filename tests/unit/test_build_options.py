"""Beam options for build-transitions: the embedded default, and the running mode that is refused."""

import pytest
from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

from recsys_rl.config import ConfigError
from recsys_rl.pipelines.build_transitions import EMBEDDED_RUNNER, BuildTransitionsConfig, pipeline_options
from recsys_rl.storage import ObjectPath


def test_without_a_runner_the_embedded_engine_is_named():
    assert pipeline_options([]).view_as(StandardOptions).runner == EMBEDDED_RUNNER
    assert pipeline_options(["--runner=DirectRunner"]).view_as(StandardOptions).runner == "DirectRunner"


@pytest.mark.parametrize(
    ("mode", "workers"),
    [("multi_processing", 2), ("in_memory", 1)],
    ids=["two-processes", "in-memory"],
)
def test_modes_that_keep_every_transition_are_accepted(mode, workers):
    options = pipeline_options([f"--direct_num_workers={workers}", f"--direct_running_mode={mode}"])
    direct = options.view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == (mode, workers)


@pytest.mark.parametrize("workers", ["1", "2", "0"])  # 0: one per core; one thread loses users too
def test_every_threaded_mode_is_refused_naming_the_race_and_the_mode_to_use(workers):
    refusal = (
        r"multi_threading loses elements \(Beam's FnApiRunner .*use --direct_running_mode=multi_processing"
    )
    with pytest.raises(ConfigError, match=refusal):
        pipeline_options([f"--direct_num_workers={workers}", "--direct_running_mode=multi_threading"])


def _config(out: str) -> BuildTransitionsConfig:
    return BuildTransitionsConfig(bootstrap_servers="localhost:9092", group="g", out=out)


def test_a_relative_out_is_made_absolute_on_the_driver(tmp_path, monkeypatch):
    """Issue 21: workers resolve a relative path against their own working directory."""
    monkeypatch.chdir(tmp_path)
    assert _config("data/transitions").out_dir == tmp_path / "data" / "transitions"
    assert _config(str(tmp_path / "abs")).out_dir == tmp_path / "abs"


@pytest.mark.parametrize("uri", ["s3://bucket/transitions", "s3://b/x/"])
def test_an_object_store_uri_for_out_stays_a_uri_instead_of_becoming_a_local_directory(uri):
    """Issue 21: Path("s3://b/x") is the local directory s3:/b/x."""
    assert _config(uri).out_dir == ObjectPath(uri.rstrip("/"))
    assert (
        str(_config(uri).out_dir / "transitions-0" / "manifest.json")
        == f"{uri.rstrip('/')}/transitions-0/manifest.json"
    )


def test_a_file_uri_for_out_is_a_local_directory(tmp_path):
    assert _config(f"file://{tmp_path}/data").out_dir == tmp_path / "data"
