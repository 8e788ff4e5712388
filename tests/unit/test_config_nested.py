"""load_config with nested sections: a training YAML carries its agent's settings as one mapping.

The point of strict loading is that a misspelt or mistyped option fails at start with its full dotted
name, so these tests check the messages as well as the values, and that the flat configs the other
commands use behave as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from recsys_rl.config import ConfigError, load_config
from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.train import TrainConfig


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    sizes: tuple[int, ...] = (8,)
    names: tuple[str, ...] = ()
    enabled: bool = False

    def __post_init__(self) -> None:
        if self.rate < 0:
            raise ValueError(f"rate should be >= 0, but is {self.rate}")


@dataclass(frozen=True)
class Middle:
    depth: int = 1
    inner: Inner = field(default_factory=Inner)


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    count: int = 1
    scale: float = 1.0
    middle: Middle = field(default_factory=Middle)


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def _raises(message: str):
    return pytest.raises(ConfigError, match=re.escape(message))


# -- nested sections ------------------------------------------------------------------------------


def test_nested_mappings_become_nested_dataclasses(tmp_path):
    path = _yaml(
        tmp_path,
        "name: run\nmiddle:\n  depth: 3\n  inner:\n    rate: 2\n    sizes: [16, 32]\n    names: [a, b]\n",
    )
    config = load_config(Outer, path)
    assert config == Outer(
        name="run", middle=Middle(depth=3, inner=Inner(rate=2, sizes=(16, 32), names=("a", "b")))
    )
    assert isinstance(config.middle.inner.sizes, tuple)
    assert isinstance(config.middle.inner.names, tuple)


def test_a_partial_nested_section_keeps_the_other_defaults(tmp_path):
    config = load_config(Outer, _yaml(tmp_path, "middle:\n  inner:\n    enabled: true\n"))
    assert config.middle == Middle(depth=1, inner=Inner(enabled=True))
    assert config.count == 1


def test_train_config_reads_its_agent_section(tmp_path):
    path = _yaml(
        tmp_path,
        "algo: tscac\ndata: /d\nout: /o\nsteps: 10\n"
        "agent:\n  aux_lambda: 2\n  behaviour-lambda: 0.25\n  actor_hidden: [32, 16]\n"
        "  funnel: [click, like]\n",
    )
    config = load_config(TrainConfig, path)
    assert config.steps == 10
    assert config.agent == AgentConfig(
        aux_lambda=2.0, behaviour_lambda=0.25, actor_hidden=(32, 16), funnel=("click", "like")
    )
    assert config.agent.critic_hidden == AgentConfig().critic_hidden


def test_train_config_round_trips_through_its_own_dict(tmp_path):
    """The run directory records ``to_dict()`` as YAML; loading that back must give the same config."""
    import yaml

    original = TrainConfig(data="/d", out="/o", agent=AgentConfig(funnel=("click",), actor_hidden=(8, 8)))
    path = _yaml(tmp_path, yaml.safe_dump(original.to_dict()))
    assert load_config(TrainConfig, path) == original


def test_an_agent_config_instance_passes_through_overrides():
    agent = AgentConfig(bc_weight=0.0)
    config = load_config(TrainConfig, None, {"data": "/d", "out": "/o", "agent": agent})
    assert config.agent is agent


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("middle:\n  bogus: 1\n", "unknown config keys ['middle.bogus']", id="one-level"),
        pytest.param(
            "middle:\n  inner:\n    sizez: [1]\n",
            "unknown config keys ['middle.inner.sizez']",
            id="two-levels",
        ),
    ],
)
def test_unknown_nested_keys_are_named_with_their_dotted_path(tmp_path, text, message):
    path = _yaml(tmp_path, text)
    with _raises(message) as caught:
        load_config(Outer, path)
    assert str(path) in str(caught.value)


def test_unknown_agent_key_names_agent_dot_key(tmp_path):
    path = _yaml(tmp_path, "data: /d\nout: /o\nagent:\n  bogus: 1\n  aux_lambda: 1\n")
    with _raises("unknown config keys ['agent.bogus']") as caught:
        load_config(TrainConfig, path)
    assert "aux_lambda" in str(caught.value)  # the known keys listed are the agent's own


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "middle:\n  depth: deep\n", "config key 'middle.depth' should be int, but is 'deep'", id="int"
        ),
        pytest.param(
            "middle:\n  inner:\n    rate: fast\n",
            "config key 'middle.inner.rate' should be float or int, but is 'fast'",
            id="float",
        ),
        pytest.param(
            "middle:\n  inner:\n    sizes: 8\n",
            "config key 'middle.inner.sizes' should be tuple, but is 8",
            id="tuple",
        ),
        pytest.param(
            "middle:\n  depth: true\n",
            "config key 'middle.depth' should be int, but is True",
            id="bool-for-int",
        ),
        pytest.param("middle: 3\n", "config key 'middle' should be a mapping, but is 3", id="section"),
        pytest.param(
            "middle:\n  inner:\n    sizes: [8, wide]\n",
            "config key 'middle.inner.sizes' should be a list of int, but is [8, 'wide']",
            id="tuple-item",
        ),
        pytest.param(
            "middle:\n  inner:\n    sizes: [8, 1.5]\n",
            "config key 'middle.inner.sizes' should be a list of int, but is [8, 1.5]",
            id="float-item",
        ),
        pytest.param(
            "middle:\n  inner:\n    sizes: [true]\n",
            "config key 'middle.inner.sizes' should be a list of int, but is [True]",
            id="bool-item",
        ),
        pytest.param(
            "middle:\n  inner:\n    names: [a, 3]\n",
            "config key 'middle.inner.names' should be a list of str, but is ['a', 3]",
            id="str-item",
        ),
    ],
)
def test_wrong_types_in_nested_fields_are_named_with_their_dotted_path(tmp_path, text, message):
    with _raises(message):
        load_config(Outer, _yaml(tmp_path, text))


def test_a_nested_sections_own_validation_is_reported_with_its_name(tmp_path):
    with _raises("middle.inner: rate should be >= 0, but is -1"):
        load_config(Outer, _yaml(tmp_path, "middle:\n  inner:\n    rate: -1\n"))


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        pytest.param("aux_lambda: -1", "agent: aux_lambda should be >= 0", id="negative-lambda"),
        pytest.param(
            "actor_hidden: []", "agent: actor_hidden should list positive layer sizes", id="no-layers"
        ),
        pytest.param("funnel: [click, likes]", "agent: funnel names unknown signals ['likes']", id="funnel"),
        pytest.param(
            "actor_hidden: [64, wide]", "config key 'agent.actor_hidden' should be", id="layer-name"
        ),
    ],
)
def test_bad_agent_settings_fail_as_config_errors(tmp_path, agent, message):
    with _raises(message):
        load_config(TrainConfig, _yaml(tmp_path, f"data: /d\nout: /o\nagent:\n  {agent}\n"))


# -- flat behaviour as before ---------------------------------------------------------------------


def test_flat_yaml_with_overrides_on_top(tmp_path):
    path = _yaml(tmp_path, "name: from-file\ncount: 2\nscale: 3\n")
    config = load_config(Outer, path, {"count": 5, "name": None})
    assert config == Outer(name="from-file", count=5, scale=3.0, middle=Middle())


def test_hyphenated_yaml_keys_yield_to_an_override_of_the_same_key(tmp_path):
    path = _yaml(tmp_path, "data: /d\nout: /o\nbatch-size: 8\nstage-one-fraction: 0.25\n")
    config = load_config(TrainConfig, path, {"batch_size": 16})
    assert config.batch_size == 16
    assert config.stage_one_fraction == 0.25


def test_flat_unknown_key_and_type_errors_keep_their_messages(tmp_path):
    with _raises("unknown config keys ['bogus']"):
        load_config(Outer, _yaml(tmp_path, "bogus: 1\n"))
    with _raises("config key 'count' should be int, but is 'many'"):
        load_config(Outer, _yaml(tmp_path, "count: many\n"))
    with _raises("steps should be at least 1, but is 0"):
        load_config(TrainConfig, _yaml(tmp_path, "data: /d\nout: /o\nsteps: 0\n"))


def test_unknown_override_key_is_a_config_error():
    with _raises("unknown config keys ['bogus'] in the overrides"):
        load_config(Outer, None, {"bogus": 1})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("- a\n- b\n", "should hold a mapping, but holds list", id="list"),
        pytest.param("a: [\n", "is not valid YAML: expected the node content", id="invalid"),
    ],
)
def test_files_that_are_not_mappings_are_refused(tmp_path, text, message):
    with _raises(message):
        load_config(Outer, _yaml(tmp_path, text))


def test_a_yaml_error_is_one_line_naming_where_it_is(tmp_path):
    """PyYAML's own message quotes the file over several lines; a command's error is one line."""
    with pytest.raises(ConfigError) as raised:
        load_config(Outer, _yaml(tmp_path, "a: 1\nb: [\n  c\n"))
    assert "\n" not in str(raised.value) and "at line 4, column 1" in str(raised.value)


def test_an_empty_file_gives_the_defaults(tmp_path):
    assert load_config(Outer, _yaml(tmp_path, "")) == Outer()


def test_a_missing_file_is_a_config_error(tmp_path):
    with _raises("cannot read config file"):
        load_config(Outer, tmp_path / "absent.yaml")
