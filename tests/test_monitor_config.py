"""MonitorConfig: explicit arguments win, then FSDPMON_* variables, then defaults; bad values
name the variable (or the argument) they came from."""

from __future__ import annotations

import pytest

from fsdpmon.conventions import TRAINING_PORT
from fsdpmon.errors import ConfigError
from fsdpmon.monitor import MonitorConfig


def test_defaults_without_environment():
    cfg = MonitorConfig.from_env(env={})
    assert cfg.port == TRAINING_PORT
    assert cfg.log_interval == 10
    assert cfg.disabled is False
    assert cfg.jsonl_path is None
    assert cfg.serves


def test_environment_fills_what_arguments_leave_unset():
    env = {"FSDPMON_PORT": "9600", "FSDPMON_JOB_NAME": "llama", "FSDPMON_LOG_INTERVAL": "5",
           "FSDPMON_DISABLED": "true", "FSDPMON_JSONL": "runs/x.jsonl",
           "FSDPMON_STALL_FACTOR": "4.5", "FSDPMON_STALL_FLOOR_SECONDS": "30",
           "FSDPMON_STALL_WAIT_FLOOR_SECONDS": "12.5"}
    cfg = MonitorConfig.from_env(env=env, port=None, job_name="explicit")
    assert cfg.port == 9600  # None = unset, so the variable applies
    assert cfg.job_name == "explicit"  # an explicit value wins
    assert (cfg.log_interval, cfg.disabled, cfg.jsonl_path) == (5, True, "runs/x.jsonl")
    assert (cfg.stall_factor, cfg.stall_floor_seconds, cfg.stall_wait_floor_seconds) == (
        4.5, 30.0, 12.5)
    assert not cfg.serves


def test_port_zero_means_do_not_serve():
    assert not MonitorConfig.from_env(env={"FSDPMON_PORT": "0"}).serves


def test_empty_optional_path_is_unset():
    assert MonitorConfig.from_env(env={"FSDPMON_JSONL": " "}).jsonl_path is None


@pytest.mark.parametrize(("env", "field"), [
    ({"FSDPMON_PORT": "ninety"}, "FSDPMON_PORT"),
    ({"FSDPMON_PORT": "70000"}, "FSDPMON_PORT"),
    ({"FSDPMON_LOG_INTERVAL": "0"}, "FSDPMON_LOG_INTERVAL"),
    ({"FSDPMON_DISABLED": "maybe"}, "FSDPMON_DISABLED"),
    ({"FSDPMON_STALL_FACTOR": "-1"}, "FSDPMON_STALL_FACTOR"),
    ({"FSDPMON_STALL_FLOOR_SECONDS": "soon"}, "FSDPMON_STALL_FLOOR_SECONDS"),
    ({"FSDPMON_STALL_WAIT_FLOOR_SECONDS": "0.5"}, "FSDPMON_STALL_WAIT_FLOOR_SECONDS"),
    ({"FSDPMON_JOB_NAME": " "}, "FSDPMON_JOB_NAME"),
])
def test_bad_environment_value_names_the_variable(env, field):
    with pytest.raises(ConfigError) as err:
        MonitorConfig.from_env(env=env)
    assert err.value.field == field
    assert str(err.value).startswith(field + ":")


def test_bad_explicit_value_names_the_argument():
    with pytest.raises(ConfigError) as err:
        MonitorConfig.from_env(env={}, log_interval=-3)
    assert err.value.field == "log_interval"


def test_unknown_argument_is_rejected():
    with pytest.raises(ConfigError) as err:
        MonitorConfig.from_env(env={}, prot=1)
    assert err.value.field == "prot"
