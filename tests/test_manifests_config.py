"""Config merging (flags > env file > defaults), defaults by instance type, and bad input."""

import pytest

from fsdpmon.errors import ConfigError
from fsdpmon.manifests.config import (
    MODELS,
    ManifestConfig,
    build_config,
    default_exporter_image,
    normalize_model,
)

TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp:llama2"
ENV = {
    "REGISTRY": "123456789012.dkr.ecr.us-west-2.amazonaws.com/",
    "IMAGE": "fsdp",
    "TAG": ":llama2",
    "JOB_NAME": "fsdp",
    "NUM_WORKERS": "4",
    "GPU_PER_WORKER": "8",
    "INSTANCE_TYPE": "p4de.24xlarge",
    "MODEL_NAME": "meta-llama/Llama-2-13b-hf",
    "CMD": "torchrun ...",
}


def build(flags=None, env=None, environ=None, from_env=False):
    return build_config(flags or {}, env or {}, environ or {}, from_env, "0.1.0")


def test_env_file_settings_and_instance_defaults():
    cfg = build(env=ENV)
    assert cfg.job_name == "fsdp"
    assert cfg.image == IMAGE
    assert cfg.nodes == 4
    assert cfg.gpus_per_node == 8
    assert cfg.efa_per_node == 4  # p4de.24xlarge has 4 EFA interfaces
    assert cfg.model == "llama2-13b"
    assert cfg.exporter_image == (
        "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdpmon-exporter:0.1.0")


def test_flags_win_over_env_file_and_unset_flags_do_not():
    cfg = build(flags={"nodes": 16, "instance_type": "p5.48xlarge", "job_name": None}, env=ENV)
    assert cfg.nodes == 16
    assert cfg.job_name == "fsdp"
    assert cfg.efa_per_node == 32  # p5.48xlarge


def test_rendezvous_in_the_env_file_means_elastic_for_pytorchjobs_only():
    env = {**ENV, "RDZV_HOST": "etcd", "RDZV_PORT": "2379", "RDZV_BACKEND": "etcd"}
    cfg = build(env=env)
    assert (cfg.elastic, cfg.rdzv_backend, cfg.rdzv_host, cfg.rdzv_port) == (
        True, "etcd", "etcd", 2379)
    assert build(env=env, flags={"kind": "trainjob"}).elastic is False


def test_unknown_instance_type_falls_back_to_8_gpus_no_efa():
    cfg = build(flags={"job_name": "a", "image": "img:1", "instance_type": "x9.large"})
    assert (cfg.gpus_per_node, cfg.efa_per_node) == (8, 0)


@pytest.mark.parametrize(
    "name, flavour",
    [
        ("meta-llama/Llama-2-7b-hf", "llama2-7b"),
        ("meta-llama/Llama-2-70b-chat-hf", "llama2-70b"),
        ("Llama2-13B", "llama2-13b"),
        ("tiny", "tiny"),
    ],
)
def test_hugging_face_names_map_to_trainer_flavours(name, flavour):
    assert normalize_model(name) == flavour


def test_known_models_are_the_trainers_flavours():
    from fsdpmon.trainer.model import FLAVOURS

    assert set(MODELS) <= set(FLAVOURS)


def test_exporter_image_defaults_next_to_the_trainer_image():
    assert default_exporter_image("reg.io/team/fsdp:1@sha256:ab", "0.1.0") == (
        "reg.io/team/fsdpmon-exporter:0.1.0")
    assert default_exporter_image("localhost:5000/fsdp", "0.1.0") == (
        "localhost:5000/fsdpmon-exporter:0.1.0")
    assert default_exporter_image("fsdp:1", "0.1.0") == "fsdpmon-exporter:0.1.0"


@pytest.mark.parametrize(
    "flags, field",
    [
        ({"job_name": "Llama_7B"}, "--job-name"),
        ({"job_name": "7b-run"}, "--job-name"),
        ({"job_name": "a" * 60}, "--job-name"),
        ({"nodes": 0}, "--nodes"),
        ({"image": ""}, "--image"),
        ({"image": "has space:1"}, "--image"),
        ({"model": "gpt-5"}, "--model"),
        ({"namespace": "Team A"}, "--namespace"),
        ({"gpus_per_node": 0}, "--gpus-per-node"),
        ({"efa_per_node": -1}, "--efa-per-node"),
        ({"release_label": "kube prometheus"}, "--release-label"),
        ({"shm_size": "lots"}, "--shm-size"),
        ({"components": ("job", "grafana")}, "--components"),
        ({"components": ()}, "--components"),
        ({"elastic": True, "rdzv_backend": "etcd"}, "--rdzv-host"),
        ({"kind": "mpijob"}, "--kind"),
        ({"kind": "trainjob", "elastic": True}, "--elastic"),
        ({"elastic": True, "min_nodes": 3}, "--min-nodes"),
    ],
)
def test_bad_values_name_the_field(flags, field):
    base = {"job_name": "llama2-7b", "image": IMAGE}
    with pytest.raises(ConfigError) as err:
        build(flags={**base, **flags})
    assert err.value.field == field


def test_missing_image_is_reported_as_image():
    with pytest.raises(ConfigError) as err:
        build(flags={"job_name": "a"})
    assert err.value.field == "--image"


def test_token_in_env_file_values_is_rejected_without_echoing_it():
    with pytest.raises(ConfigError) as err:
        build(env={**ENV, "MODEL_NAME": TOKEN})
    assert err.value.field == "MODEL_NAME"
    assert TOKEN not in str(err.value)


def test_hf_token_from_environment_or_env_file_only_with_the_flag():
    flags = {"job_name": "a", "image": "img:1"}
    assert build(flags=flags, environ={"HF_TOKEN": TOKEN}).hf_token is None
    assert build(flags=flags, environ={"HF_TOKEN": TOKEN}, from_env=True).hf_token == TOKEN
    assert build(flags=flags, env={"HF_TOKEN": TOKEN}, from_env=True).hf_token == TOKEN
    with pytest.raises(ConfigError) as err:
        build(flags=flags, from_env=True)
    assert err.value.field == "HF_TOKEN"


def test_the_token_never_shows_in_the_configs_repr():
    cfg = ManifestConfig(job_name="a", image="i:1", exporter_image="e:1", hf_token=TOKEN)
    assert TOKEN not in repr(cfg)
