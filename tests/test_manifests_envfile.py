"""The aws-do-fsdp style env file: what a shell would make of it, without running it."""

import pytest

from fsdpmon.errors import InputError
from fsdpmon.manifests.envfile import parse_env_text, read_env_file

AWS_DO_FSDP_STYLE = """\
#!/bin/bash
# Docker image settings
export REGISTRY=123456789012.dkr.ecr.us-west-2.amazonaws.com/
export IMAGE=fsdp
export TAG=:llama2   # trailing comment

## Job settings
export JOB_NAME="fsdp-${IMAGE}"
export NUM_WORKERS=2
GPU_PER_WORKER=8
export EFA_PER_WORKER='32'
export INSTANCE_TYPE=p5.48xlarge
export MODEL_NAME=meta-llama/Llama-2-7b-hf
export CMD="torchrun --nproc_per_node=$GPU_PER_WORKER --nnodes=${NUM_WORKERS} train.py"
export LITERAL='no $EXPANSION # here'
export ESCAPED="cost \\$5 and a \\"quote\\""
export EMPTY=
export FROM_ENV=$HOME_DIR/data
export SUBSHELL=$(whoami)
"""


def test_parses_the_workflows_env_file():
    env = parse_env_text(AWS_DO_FSDP_STYLE, environ={"HOME_DIR": "/home/u"})
    assert env["REGISTRY"] == "123456789012.dkr.ecr.us-west-2.amazonaws.com/"
    assert env["TAG"] == ":llama2"
    assert env["JOB_NAME"] == "fsdp-fsdp"
    assert env["NUM_WORKERS"] == "2"
    assert env["GPU_PER_WORKER"] == "8"
    assert env["EFA_PER_WORKER"] == "32"
    assert env["MODEL_NAME"] == "meta-llama/Llama-2-7b-hf"
    assert env["CMD"] == "torchrun --nproc_per_node=8 --nnodes=2 train.py"
    assert env["LITERAL"] == "no $EXPANSION # here"
    assert env["ESCAPED"] == 'cost $5 and a "quote"'
    assert env["EMPTY"] == ""
    assert env["FROM_ENV"] == "/home/u/data"
    # Command substitution is never run; an undefined $(...) stays as text after expansion.
    assert env["SUBSHELL"] == "$(whoami)"
    assert next(iter(env)) == "REGISTRY"


def test_later_assignment_wins_and_unknown_reference_is_empty():
    env = parse_env_text("A=1\nA=2\nexport A NOPE\nB=${A}-$NOPE-x\n", environ={})
    assert env == {"A": "2", "B": "2--x"}


@pytest.mark.parametrize(
    "text, problem",
    [
        ("export\n", "expected KEY=value"),
        ("1BAD=x\n", "expected KEY=value"),
        ("just words\n", "expected KEY=value"),
        ("A='open\n", "unterminated single quote"),
        ('A="open\n', "unterminated double quote"),
        ('A="x" y\n', "unexpected text after the closing quote"),
    ],
)
def test_malformed_lines_name_file_and_line_but_not_the_value(text, problem):
    secretish = "hf_" + "q" * 34
    with pytest.raises(InputError) as err:
        parse_env_text("OK=1\n" + text.replace("x", secretish), source=".env", environ={})
    assert ".env:2: " in str(err.value)
    assert problem in str(err.value)
    assert secretish not in str(err.value)


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match=r"--env-file: .* does not exist"):
        read_env_file(tmp_path / "nope.env")


def test_reads_a_real_file(tmp_path):
    path = tmp_path / ".env"
    path.write_text("export JOB_NAME=a\r\nexport NUM_WORKERS=4\r\n")
    assert read_env_file(path, environ={}) == {"JOB_NAME": "a", "NUM_WORKERS": "4"}
