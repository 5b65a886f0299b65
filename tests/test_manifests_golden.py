"""Golden files: the reference 2-node x 8-GPU llama2-7b job on p5.48xlarge, in both kinds.

A change to the generated YAML must be deliberate: regenerate with
`FSDPMON_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_manifests_golden.py` and review
the diff. (Rules and dashboards come from the dashboards package and are checked elsewhere.)
"""

import os
from pathlib import Path

import pytest
import yaml
from manifest_schemas import pytorchjob_admission_errors, validate_object

from fsdpmon.cli import main

GOLDEN = Path(__file__).parent / "golden"
REFERENCE = [
    "--job-name", "llama2-7b", "--namespace", "ml", "--nodes", "2", "--gpus-per-node", "8",
    "--instance-type", "p5.48xlarge", "--efa-per-node", "32", "--model", "llama2-7b",
    "--image", "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp:llama2",
    "--data-pvc", "fsx-claim", "--components", "job,exporter,rbac",
]


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_reference_job_matches_golden_file(kind, capsys):
    assert main(["manifests", *REFERENCE, "--kind", kind]) == 0
    text = capsys.readouterr().out
    path = GOLDEN / f"{kind}-llama2-7b-2x8.yaml"
    if os.environ.get("FSDPMON_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; see this module's docstring"


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_golden_files_themselves_validate(kind):
    docs = [d for d in yaml.safe_load_all((GOLDEN / f"{kind}-llama2-7b-2x8.yaml").read_text())
            if d]
    for doc in docs:
        validate_object(doc)
    if kind == "pytorchjob":
        job = next(d for d in docs if d["kind"] == "PyTorchJob")
        assert pytorchjob_admission_errors(job) == []
        assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    else:
        job = next(d for d in docs if d["kind"] == "TrainJob")
        assert (job["spec"]["trainer"]["numNodes"], job["spec"]["trainer"]["numProcPerNode"]) == (
            2, 8)
