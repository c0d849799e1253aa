"""Config validation: every mistake is one line naming the field and what is allowed."""
from pathlib import Path

import pytest

from hpcrl.config import build_config, load_config
from hpcrl.errors import ConfigError


def one_line_error(data=None, overrides=()):
    with pytest.raises(ConfigError) as info:
        build_config(data, list(overrides))
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_default_config_is_the_four_rank_cartpole_job():
    cfg = load_config()
    assert cfg.env.id == "CartPole-v1"
    assert cfg.num_ranks == 4 and cfg.uses_mpi


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"aggregation": {"d": 1.5}}, "aggregation.d"),
        ({"aggregation": {"d": -0.1}}, "aggregation.d"),
        ({"algo": {"lr": 0}}, "algo.lr"),
        ({"algo": {"lr": -1e-3}}, "algo.lr"),
        ({"algo": {"lr": 1e300}}, "algo.lr: Input should be less than or equal to 1"),  # once trained to version 2, then stuck
        ({"algo": {"name": "hddpg", "critic_lr": 2}}, "algo.critic_lr"),
        ({"algo": {"name": "iql", "agents": 3, "lr": 1.5}}, "algo.lr"),
        ({"aggregation": {"policy": "fastest"}}, "'pure_async', 'sync', 'ssp' or 'softsync'"),
        ({"learners": {"groups": 2, "min_active": 3}}, "min_active"),
        ({"aggregation": {"mailbox_slots": 1}}, "aggregation.mailbox_slots"),
        ({"name": "a b;rm -rf"}, "name"),
    ],
)
def test_bad_values_name_the_field(data, expected):
    assert expected in one_line_error(data)


def test_unknown_keys_list_the_allowed_ones():
    msg = one_line_error({"env": {"idd": "CartPole-v1"}})
    assert "env.idd" in msg and "num_envs" in msg
    msg = one_line_error({"learner": {}})
    assert "'learner'" in msg and "learners" in msg


def test_an_unknown_algo_key_lists_that_algorithms_keys_and_blames_the_override():
    from hpcrl.config import load_config
    from hpcrl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(Path(__file__).parents[1] / "hpcrl" / "configs" / "mpe_spread_iql.yaml", ["algo.lrr=0.1"])
    msg = str(e.value)
    assert msg.startswith("-o algo.lrr=0.1: unknown key 'algo.lrr'") and "yaml" not in msg.split(";")[0], msg
    assert "(algo.name=iql)" in msg and "buffer_size" in msg and "num_sgd_iter" not in msg, msg


def test_unknown_algorithm_lists_the_known_ones():
    msg = one_line_error({"algo": {"name": "dqn"}})
    assert "ppo" in msg and "ha2c" in msg and "hddpg" in msg


def test_overrides_are_parsed_as_yaml_and_validated():
    cfg = build_config({}, ["aggregation.d=0.9", "learners.groups=3", "aggregation.is_truncation=false"])
    assert cfg.aggregation.d == 0.9 and cfg.learners.groups == 3 and cfg.aggregation.is_truncation is False
    assert cfg.num_ranks == 1 + 3 + cfg.actors.count
    assert "KEY=VALUE" in one_line_error({}, ["aggregation.d"])


def test_exponent_numbers_are_numbers_in_files_and_overrides(tmp_path):
    """PyYAML (YAML 1.1) would read 1e-3 as the string '1e-3' and the typed field would refuse it."""
    assert build_config({}, ["algo.lr=1e-3"]).algo.lr == 1e-3
    f = tmp_path / "exp.yaml"
    f.write_text("algo: {lr: 3E-4, clip: 2e-1}\nenv: {id: CartPole-v1, kwargs: {tag: 1e3x}}\n")
    cfg = load_config(f)
    assert cfg.algo.lr == 3e-4 and cfg.algo.clip == 0.2 and cfg.env.kwargs == {"tag": "1e3x"}


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = build_config({"aggregation": {"d": 0.92}, "algo": {"name": "ppo", "clip": 0.3}})
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


def test_config_reference_is_current_and_every_field_is_documented():
    from pathlib import Path

    from pydantic import BaseModel

    from hpcrl import config
    from hpcrl.config_docs import render_markdown

    doc = Path(__file__).resolve().parents[1] / "docs" / "config.md"
    assert doc.read_text() == render_markdown(), "run: python -m hpcrl.config_docs > docs/config.md"
    for model in (config.EnvConfig, config.ModelConfig, config.ActorsConfig, config.LearnersConfig,
                  config.AggregationConfig, config.PPOConfig, config.HA2CConfig, config.HDDPGConfig, config.IOConfig,
                  config.ContainerConfig, config.LaunchConfig, config.StopConfig, config.DebugConfig):
        for name, field in model.model_fields.items():
            sub = field.annotation
            if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
                assert field.description, f"{model.__name__}.{name} has no docstring"
