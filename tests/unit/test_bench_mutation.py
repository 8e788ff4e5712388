"""The mutation benchmark's bookkeeping: its score, the accepted survivors and the mutant summaries.

mutmut itself runs in CI's sample (`.ci/run`); these pin what the script makes of its results.
"""

from __future__ import annotations

import json
import signal

import pytest
from bench_scripts import load_bench_script


@pytest.fixture(scope="module")
def mutation():
    return load_bench_script("mutation")


def test_timeouts_count_as_killed_and_mutants_no_test_reaches_count_against(mutation):
    counts = {"killed": 6, "timeout": 2, "survived": 1, "no_tests": 1, "not_checked": 0}
    assert mutation.score(counts) == 0.8
    assert mutation.score({"killed": 0, "timeout": 0, "not_checked": 4}) is None  # nothing was tested


def test_a_survivor_is_explained_only_by_an_entry_naming_its_current_mutation(mutation):
    result = {
        "score": 0.9,
        "surviving": [
            {"id": "x_f__mutmut_1", "mutation": "a -> b"},
            {"id": "x_f__mutmut_2", "mutation": "c -> d"},
            {"id": "x_g__mutmut_1", "mutation": "e -> f", "reason": "accepted once, dropped since"},
        ],
    }
    accepted = {
        "x_f__mutmut_1": {"mutation": "a -> b", "reason": "equivalent"},
        "x_f__mutmut_2": {"mutation": "c -> D", "reason": "the function changed since"},
    }
    explained = mutation.explain(result, accepted)
    assert explained["unexplained"] == 2 and explained["score"] == 0.9
    assert [m.get("reason") for m in explained["surviving"]] == ["equivalent", None, None]


def test_the_overall_entry_sums_each_modules_counts(mutation):
    modules = {
        "a.py": {"killed": 8, "survived": 2, "timeout": 0, "no_tests": 0, "total": 10, "unexplained": 1},
        "b.py": {"killed": 3, "survived": 0, "timeout": 1, "no_tests": 1, "total": 5, "unexplained": 0},
    }
    overall = mutation.overall(modules)
    assert overall["total"] == 15 and overall["unexplained"] == 1
    assert overall["score"] == round(12 / 15, 4)


def test_a_summary_cuts_both_sides_to_the_change_with_context(mutation):
    old = "x" * 50 + "a >= b" + "y" * 50
    new = "x" * 50 + "a > b" + "y" * 50
    # the change is the "=" at index 53 (dropped): 20 characters either side of it, on both sides
    expected = "…" + "x" * 17 + "a >= b" + "y" * 18 + "… -> …" + "x" * 17 + "a > b" + "y" * 18 + "…"
    assert mutation.summarise(old, new) == expected
    assert mutation.summarise("f(1)", "f(2)") == "f(1) -> f(2)"
    assert len(mutation.summarise("a" * 500, "b" * 500)) == mutation.DIFF_CHARS


def test_modules_are_staged_at_their_installed_path(mutation):
    assert mutation.staged_path("pipelines/episodes.py") == "recsys_rl/pipelines/episodes.py"
    assert mutation.staged_path("recsys_rl/ope/gate.py") == "recsys_rl/ope/gate.py"
    with pytest.raises(SystemExit, match="is not under one of"):
        mutation.staged_path("docs/simulator.md")


def test_every_accepted_survivor_has_a_mutation_and_a_reason_under_a_configured_module(mutation):
    import tomllib

    accepted = tomllib.loads(mutation.ACCEPTED.read_text())
    configured = mutation.load_config(mutation.ROOT / "pyproject.toml")["modules"]
    assert set(accepted) <= set(configured)
    for entries in accepted.values():
        for entry in entries.values():
            assert set(entry) == {"mutation", "reason"} and entry["reason"].strip()


def test_explain_only_reads_the_accepted_list_into_an_earlier_result_without_running(mutation, tmp_path):
    import tomllib

    accepted = tomllib.loads(mutation.ACCEPTED.read_text())
    module, entries = next(iter(accepted.items()))
    mutant_id, entry = next(iter(entries.items()))
    survivor = {"id": mutant_id, "mutation": entry["mutation"], "reason": "stale"}
    stranger = {"id": "x_unknown__mutmut_1", "mutation": "a -> b", "reason": "stale"}
    result = {"killed": 8, "survived": 2, "timeout": 0, "no_tests": 0, "total": 10, "score": 0.8}
    out = tmp_path / "mutation.json"
    out.write_text(json.dumps({"modules": {module: {**result, "surviving": [survivor, stranger]}}}))
    handler = signal.getsignal(signal.SIGTERM)  # main turns SIGTERM into SystemExit for its run
    try:
        assert mutation.main(["--explain-only", "--out", str(out)]) == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
    written = json.loads(out.read_text())
    surviving = written["modules"][module]["surviving"]
    assert [s.get("reason") for s in surviving] == [entry["reason"], None]
    assert written["modules"][module]["unexplained"] == 1 and written["overall"]["score"] == 0.8


def test_tests_that_start_tensorflow_when_collected_are_refused_before_mutmut_runs(mutation, tmp_path):
    (tmp_path / "test_idle.py").write_text(
        "import tensorflow as tf\n\ndef test_x():\n    assert float(tf.constant(1.0)) == 1.0\n"
    )
    (tmp_path / "test_started.py").write_text(
        "import tensorflow as tf\n\nONE = tf.constant(1.0)\n\ndef test_x():\n    assert float(ONE) == 1.0\n"
    )
    (tmp_path / "test_plain.py").write_text("def test_x():\n    assert True\n")
    assert mutation.fork_hang(tmp_path, ["test_idle.py", "test_plain.py"], timeout_s=5) is None
    reason = mutation.fork_hang(tmp_path, ["test_idle.py", "test_started.py"], timeout_s=5)
    assert "hangs in TensorFlow" in reason and "test_started.py" in reason
    assert "collecting ['test_missing.py'] failed" in mutation.fork_hang(tmp_path, ["test_missing.py"])
