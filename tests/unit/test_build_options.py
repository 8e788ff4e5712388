"""Beam options for build-transitions: the embedded default, and the running mode that is refused."""

import pytest
from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

from recsys_rl.pipelines.build_transitions import EMBEDDED_RUNNER, pipeline_options


def test_without_a_runner_the_embedded_engine_is_named():
    assert pipeline_options([]).view_as(StandardOptions).runner == EMBEDDED_RUNNER
    assert pipeline_options(["--runner=DirectRunner"]).view_as(StandardOptions).runner == "DirectRunner"


@pytest.mark.parametrize(
    ("mode", "workers"),
    [("multi_processing", 2), ("multi_threading", 1)],
    ids=["two-processes", "one-thread"],
)
def test_modes_that_keep_every_transition_are_accepted(mode, workers):
    options = pipeline_options([f"--direct_num_workers={workers}", f"--direct_running_mode={mode}"])
    direct = options.view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == (mode, workers)


@pytest.mark.parametrize("workers", ["2", "0"])  # 0: one per core
def test_several_threads_are_refused_naming_the_mode_to_use(workers):
    refusal = r"multi_threading loses transitions.*use --direct_running_mode=multi_processing"
    with pytest.raises(ValueError, match=refusal):
        pipeline_options([f"--direct_num_workers={workers}", "--direct_running_mode=multi_threading"])
