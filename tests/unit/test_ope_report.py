"""The OPE report: the lift plot draws whatever intervals the estimators give; the headline and the gate's
configuration say what the blessing is worth."""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pytest

from recsys_rl.ope.gate import GateConfig, Lift, Support, decide
from recsys_rl.ope.offline_evaluation import ESTIMATORS
from recsys_rl.ope.report import (
    _absolute_table,
    _estimator_table,
    _gate_section,
    _lift_plot,
    _reward_fit_table,
    _risk_section,
    _status,
    actions_figure,
    agreement_figure,
    render_ranking,
    verdict_line,
)
from recsys_rl.signals import FEED_SIGNALS


def _entry(value, low, high) -> dict:
    return {"relative": {"value": value, "interval": [low, high]}}


def test_a_point_outside_its_percentile_interval_is_drawn_not_refused():
    """A percentile bootstrap interval of a ratio need not contain the point estimate; the pipeline run
    that met one (a sparse signal over a small baseline) failed in matplotlib's error bars."""
    report = {
        "lift": {
            "signals": ["watch_time", "hate"],
            "estimators": {
                "snips": {
                    "overall": {"watch_time": _entry(0.02, -0.01, 0.05), "hate": _entry(0.9, -0.5, 0.4)},
                    "groups": {
                        "high_active": {"watch_time": _entry(None, None, None), "hate": _entry(0, 0, 0)}
                    },
                }
            },
        }
    }
    image = _lift_plot(report, "snips")
    assert image.startswith('<img alt="plot" src="data:image/png;base64,') and len(image) > 1000


def _report(gate: GateConfig, *warnings: str, win: bool = True) -> dict:
    """The parts of a report the headline and the gate section read."""
    lifts = {name: (0.01, 0.005, 0.015) if win else (0.0, -0.01, 0.01) for name in FEED_SIGNALS}
    support = [Support("candidate", "decision", 5000.0, 0.001, warnings)]
    verdict = decide(gate, {name: Lift(*lift) for name, lift in lifts.items()}, support)
    return {"gate": dataclasses.asdict(gate), "verdict": verdict.to_dict()}


@pytest.mark.parametrize(
    ("warnings", "win", "expected"),
    [
        pytest.param((), True, '<span class="pass">BLESSED</span>', id="clean"),
        pytest.param(
            ("session level: effective sample size 93 (4.9% of 1,896 sessions) is below 100", "mean weight"),
            True,
            '<span class="warn">BLESSED with 2 warnings</span>',
            id="warnings",
        ),
        pytest.param(("mean weight",), False, '<span class="fail">NOT BLESSED</span>', id="failed"),
    ],
)
def test_a_blessing_with_warnings_is_not_shown_as_a_clean_one(warnings, win, expected):
    """Issue 19: the demo's page said BLESSED in green above its warnings."""
    assert _status(_report(GateConfig(), *warnings, win=win)["verdict"]) == expected


def test_the_page_shows_the_gates_settings_and_labels_a_loose_gate():
    standard = _gate_section(_report(GateConfig()))
    assert "<h2>Gate configuration</h2>" in standard and "Loose gate" not in standard
    assert "<tr><td>min_ess</td><td>1000</td><td>&gt;= 1000</td><td></td></tr>" in standard
    loose = GateConfig(min_main_lift=-0.1, min_ess=100.0, max_weight_share=0.1)
    page = _gate_section(_report(loose))
    assert '<p class="warn">Loose gate: 3 settings looser than the recommended defaults' in page
    assert "<li>min_ess 100 (recommended &gt;= 1000)</li>" in page
    assert (
        '<tr class="looser"><td>max_weight_share</td><td>0.1</td><td>&lt;= 0.01</td><td>looser</td></tr>'
        in page
    )


# -- the full page (issue 19 item 8): a report of a shifted behaviour policy on a small simulated day ------


@pytest.fixture(scope="module")
def logged():
    from ope_reports import simulated_logs

    return simulated_logs()


@pytest.fixture(scope="module")
def full_report(logged) -> dict:
    from ope_reports import build_report

    return build_report(logged)


def _row(table: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell starts with ``first_cell``."""
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table):
        cells = re.findall(r"<td>(.*?)</td>", row)
        if cells and cells[0].startswith(first_cell):
            return cells
    raise AssertionError(f"no row {first_cell!r} in {table[:300]}")


def test_the_gating_estimators_absolute_values_are_shown_in_the_signals_units(full_report):
    """Not only lifts: seconds of watch time per decision for candidate and baseline, with intervals."""
    entry = full_report["lift"]["estimators"]["snips"]["overall"]["watch_time"]
    cells = _row(_absolute_table(full_report), "watch_time")
    assert cells[1] == "seconds per decision"
    low, high = entry["candidate"]["interval"]
    assert cells[2] == f"{entry['candidate']['value']:,.4g} [{low:,.4g}, {high:,.4g}]"
    low, high = entry["baseline"]["interval"]
    assert cells[4] == f"{entry['baseline']['value']:,.4g} [{low:,.4g}, {high:,.4g}]"
    # a sequential gating estimator's values are discounted session returns
    sequential = {**full_report, "gate": {**full_report["gate"], "estimator": "pdis"}}
    assert _row(_absolute_table(sequential), "watch_time")[1] == "discounted seconds per session"


def test_the_simulators_truth_stands_beside_the_estimates(full_report):
    truth = full_report["ground_truth"]["scales"]["per_decision"]["watch_time"]
    cells = _row(_absolute_table(full_report), "watch_time")
    assert cells[3] == f"{truth['candidate']['value']:,.4g} ± {truth['candidate']['stderr']:,.2g}"
    assert cells[5] == f"{truth['baseline']['value']:,.4g} ± {truth['baseline']['stderr']:,.2g}"
    table = _estimator_table(full_report)
    per_session = full_report["ground_truth"]["scales"]["per_session_discounted"]["watch_time"]["relative"]
    assert re.search(r'<tr class="truth"><td>simulator truth</td><td>per_session_discounted</td>', table)
    assert f"{100 * per_session['value']:+.2f}% ± {100 * per_session['stderr']:.2f}%" in table
    without = {**full_report, "ground_truth": None}
    assert "simulator truth" not in _absolute_table(without) + _estimator_table(without)


def test_dm_and_fqe_are_marked_wherever_they_are_shown(full_report):
    """Their intervals hold the fitted model fixed: the table and the chart both say so."""
    table = _estimator_table(full_report)
    for name in ("dm", "fqe"):
        assert f'<tr class="model-only"><td>{name} (model error not included)</td>' in table
    assert table.count("model error not included") == 4  # the label and the interval column, twice
    assert '<tr class="gating"><td>snips (gating)</td>' in table
    figure = agreement_figure(full_report)
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert legend == [
        "gating estimator (snips)",
        "other estimators",
        "model error not included",
        "simulator truth (per scale)",
    ]
    axis = figure.axes[0]  # watch_time
    names = [label.get_text() for label in axis.get_xticklabels()]
    points = {int(line.get_xdata()[0]): line for line in axis.lines if line.get_marker() == "o"}
    assert points[names.index("dm")].get_markerfacecolor() == "white"
    assert points[names.index("fqe")].get_markerfacecolor() == "white"
    assert points[names.index("dr")].get_markerfacecolor() != "white"
    assert points[names.index("snips")].get_color() == "#ee7733"
    # every panel compares the same estimators: one shared x axis
    assert all(figure.axes[0].get_shared_x_axes().joined(figure.axes[0], other) for other in figure.axes[1:])
    plt.close(figure)


def test_the_reward_model_fit_and_the_risk_measures_are_tabled(full_report):
    fit = full_report["lift"]["reward_model_fit"]["signals"]["watch_time"]
    cells = _row(_reward_fit_table(full_report), "watch_time")
    assert cells[1] == f"{fit['r2']:,.3g}" and cells[2] == f"{fit['rmse']:,.4g} seconds per decision"
    section = _risk_section(full_report)
    risk = full_report["lift"]["risk"]
    for policy, key in (("candidate", "candidate"), ("baseline (behaviour)", "baseline")):
        figures = risk[key]["signals"]["watch_time"]
        row = next(
            cells
            for cells in (re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", section))
            if cells[:2] == ["watch_time", policy]
        )
        assert row[2:7] == [
            f"{figures['mean']:,.4g}",
            f"{figures['variance']:,.4g}",
            f"{figures['variance'] ** 0.5:,.4g}",
            f"{figures['lower_quartile']:,.4g}",
            f"{figures['cvar']:,.4g}",
        ]
    assert "<th>CVaR 10%</th>" in section and "<th>25% quantile</th>" in section


def test_the_candidates_actions_are_drawn_at_the_logged_states(logged):
    """Per fusion-weight logit: the candidate's draws sit where its mean says, the logged ones where the
    behaviour's does; the same seed draws the same actions."""
    from ope_reports import FEED, TARGET

    from recsys_rl.ope.evaluate import action_distributions

    actions = action_distributions(logged, {"candidate": TARGET}, "feed", seed=5)
    assert (actions["kind"], actions["series"], actions["states"]) == (
        "continuous",
        ["logged", "candidate"],
        logged.rows,
    )
    assert logged.rows > 500  # a day of 150 users: enough draws for the bound on the means below
    shift = TARGET.mean(logged.states) - FEED.mean(logged.states)
    for i, name in enumerate(actions["names"]):
        dimension = actions["dimensions"][name]
        moved = dimension["mean"]["candidate"] - dimension["mean"]["logged"]
        assert moved == pytest.approx(shift[:, i].mean(), abs=4 * 0.3 * (2 / logged.rows) ** 0.5)
        for series in actions["series"]:
            assert sum(dimension["counts"][series]) + dimension["outside"][series] == logged.rows
    assert action_distributions(logged, {"candidate": TARGET}, "feed", seed=5) == actions
    assert action_distributions(logged, {"candidate": TARGET}, "feed", seed=6) != actions
    figure = actions_figure(actions)
    first = figure.axes[0]
    assert all(first.get_shared_x_axes().joined(first, other) for other in figure.axes[1:7])
    assert all(first.get_shared_y_axes().joined(first, other) for other in figure.axes[1:7])
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["logged", "candidate"]
    plt.close(figure)


def test_live_allocation_actions_are_insert_rates():
    """A 0/1 insert: two bins, and the mean is the share of decisions that insert."""
    from recsys_rl.ope.evaluate import action_distributions
    from recsys_rl.sim.behaviour import BernoulliAllocationPolicy
    from recsys_rl.state import LIVE_STATE_FEATURES
    from recsys_rl.training.agents.policy_io import ColumnActions

    states = np.zeros((4000, len(LIVE_STATE_FEATURES)), np.float32)
    always = BernoulliAllocationPolicy(bias=10.0, coef=np.zeros(len(LIVE_STATE_FEATURES)), epsilon=0.05)
    logged = SimpleNamespace(states=states, actions=np.zeros((4000, 1), np.float32), rows=4000)
    actions = action_distributions(logged, {"candidate": ColumnActions(always)}, "live_allocation", seed=0)
    assert (actions["kind"], actions["names"]) == ("binary", ["insert"])
    insert = actions["dimensions"]["insert"]
    assert insert["edges"] == [-0.5, 0.5, 1.5] and insert["counts"]["logged"] == [4000, 0]
    assert insert["mean"]["candidate"] == pytest.approx(0.95, abs=0.015)
    figure = actions_figure(actions)
    assert figure.axes[0].get_ylabel() == "decisions inserting a live stream, %"
    plt.close(figure)


def test_the_page_reads_the_same_from_report_json(full_report):
    """report.json sorts its keys; the page must not change when read back from the file: the order of
    estimators, user groups and action dimensions comes from the library, not from the dict. (The whole
    page, images included, is compared in tests/integration/test_evaluate.py.)"""
    from recsys_rl.ope.report import _actions_section, _groups

    read_back = json.loads(json.dumps(full_report, sort_keys=True))
    order = re.findall(r"<tr[^>]*><td>([a-z_]+)[ <]", _estimator_table(read_back))
    assert order == [*ESTIMATORS, "simulator", "simulator"]
    assert _actions_section(read_back) == _actions_section(full_report)
    diagnostics = read_back["lift"]["diagnostics"]["candidate"]
    assert _groups(diagnostics) == list(full_report["lift"]["diagnostics"]["candidate"]["groups"])
    block = read_back["lift"]["estimators"]["snips"]
    assert _groups(block) == list(full_report["lift"]["estimators"]["snips"]["groups"])


def test_several_candidates_are_ranked_by_the_main_signals_lower_bound(full_report):
    """Best lower bound first, an undefined one last, ties in the order given; each with its verdict."""
    from recsys_rl.ope.evaluate import EvaluateConfig, _Evaluation, rank
    from recsys_rl.ope.gate import Verdict

    def candidate(version: str, low: float | None, passed: bool) -> _Evaluation:
        report = json.loads(json.dumps(full_report))
        report["inputs"]["candidate"]["version"] = version
        report["lift"]["estimators"]["snips"]["overall"]["watch_time"]["relative"]["interval"][0] = low
        verdict = Verdict(passed, () if passed else ("no",), ())
        return _Evaluation(version, report, "", None, verdict)

    evaluations = [
        candidate("a", -0.02, False),
        candidate("b", None, False),
        candidate("c", 0.01, True),
        candidate("d", -0.02, False),
    ]
    config = EvaluateConfig(candidates=("a", "b", "c", "d"), data="x", out="y")
    ranking = rank(evaluations, config, SimpleNamespace(data_manifest=full_report["inputs"]["dataset"]))
    assert [(e["rank"], e["version"]) for e in ranking["candidates"]] == [
        (1, "c"),
        (2, "a"),
        (3, "d"),
        (4, "b"),
    ]
    assert [e["headline"] for e in ranking["candidates"]] == ["BLESSED"] + ["NOT BLESSED"] * 3
    assert (
        ranking["candidates"][0]["truth"]
        == full_report["ground_truth"]["scales"]["per_decision"]["watch_time"]
    )
    page = render_ranking(ranking)
    assert page.index('href="candidates/c/report.html"') < page.index('href="candidates/a/report.html"')


# -- the verdict in one line: the command, the demo's summary, the pipeline's output (issue 19 item 8.9) --


def test_the_verdict_line_counts_warnings_and_labels_a_loose_gate():
    assert verdict_line(_report(GateConfig())["verdict"]) == "BLESSED"
    assert verdict_line(_report(GateConfig(), "mean weight")["verdict"]) == "BLESSED with 1 warning"
    loose = _report(GateConfig(min_main_lift=-0.1, min_ess=100.0), "a", "b")["verdict"]
    assert verdict_line(loose) == "BLESSED with 2 warnings by a LOOSE gate (2 settings looser)"
    assert verdict_line(_report(GateConfig(), win=False)["verdict"]) == "NOT BLESSED"


def _pipeline_record(tmp_path, evaluate_outputs: dict) -> dict:
    dataset = tmp_path / "dataset"
    dataset.mkdir(exist_ok=True)
    (dataset / "manifest.json").write_text(json.dumps({"surfaces": {}}))
    ingest = {
        "records": 10,
        "dataset": str(dataset),
        "accounting": {"used_in_transitions": 10, "dead_lettered": 0},
    }
    ingest["accounting"]["dead_lettered_by_reason"] = {}
    return {
        "run_id": "r1",
        "status": "complete",
        "steps": {
            "ingest": {"status": "done", "seconds": 1.0, "outputs": ingest},
            "evaluate": {"status": "done", "seconds": 2.0, "outputs": evaluate_outputs},
        },
    }


def test_the_demo_summary_and_the_pipeline_print_the_headline_not_the_flag(tmp_path):
    """Issue 19: both printed BLESSED from blessing.passed alone, above a blessing with warnings by a
    loose gate."""
    from recsys_rl.loop.demo import _run_lines
    from recsys_rl.pipelines.training_pipeline import PipelineResult

    line = "BLESSED with 2 warnings by a LOOSE gate (9 settings looser)"
    outputs = {"report": "/r", "incumbent": "behaviour", "blessed": True, "verdict": line, "reasons": []}
    outputs["loose_settings"] = ["min_ess 100 (recommended >= 1000)"] * 9
    record = _pipeline_record(tmp_path, outputs)
    assert f"    OPE verdict vs behaviour: {line}" in _run_lines("pipeline run 1", record)
    text = PipelineResult(tmp_path, record, resumed=False).text()
    assert f"verdict={line}" in text and "blessed=" not in text and "loose_settings" not in text
    # a run recorded before the verdict line was kept still prints
    old = {k: v for k, v in outputs.items() if k not in ("verdict", "loose_settings")}
    assert "    OPE verdict vs behaviour: BLESSED" in _run_lines("run", _pipeline_record(tmp_path, old))


def test_a_world_that_does_not_reproduce_the_logs_is_called_out(full_report):
    """The world is declared, not recorded: when the behaviour policy in it misses the logged value, the
    page says its truth is not the logs'."""
    from recsys_rl.ope.report import _ground_truth_section

    assert "World check passed" in _ground_truth_section(full_report)
    truth = full_report["ground_truth"]
    failed = {**truth, "world_check": {**truth["world_check"], "passed": False, "z": 9.0}}
    section = _ground_truth_section({**full_report, "ground_truth": failed})
    assert "<p class='fail'>World check failed" in section and "9 standard errors apart" in section
    assert _ground_truth_section({**full_report, "ground_truth": None}) == ""
