"""A hang's culprit frame is the innermost frame of the user's code, not the library call it is
stuck in (threading.py's wait); the frames below it stay in the stack and the report."""

from __future__ import annotations

from fsdpmon.diagnose import Finding, RankStack, merge
from fsdpmon.diagnose.report import finding_lines
from fsdpmon.diagnose.stacks import Frame

LIB = "/root/.pyenv/versions/3.11.7/lib/python3.11"
TORCH = "/srv/venv/lib/python3.11/site-packages/torch"
HOST_HANG = (Frame("/app/trainer/train.py", 210, "run"),
             Frame("/app/trainer/faults.py", 157, "after_step"),
             Frame("/app/trainer/faults.py", 61, "block_forever_in_host_call"),
             Frame(f"{LIB}/threading.py", 629, "wait"),
             Frame(f"{LIB}/threading.py", 327, "wait"))
WAITING = (Frame("/app/trainer/train.py", 210, "run"),
           Frame("/app/trainer/train.py", 154, "train_step"),
           Frame(f"{TORCH}/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 301,
                 "foreach_all_gather"),
           Frame(f"{TORCH}/distributed/distributed_c10d.py", 3800, "all_gather_into_tensor"),
           Frame("/app/fsdpmon/monitor/collectives.py", 230, "wrapper"))


def test_the_culprit_is_the_users_innermost_frame_and_the_rest_is_kept():
    odd, waiting = merge([RankStack(1, 60, "", True, "all_reduce", 210, HOST_HANG),
                          *(RankStack(r, 60, "", True, "all_gather_into_tensor", 211, WAITING)
                            for r in (0, 2, 3))])
    assert odd.culprit == HOST_HANG[2] and odd.frames == HOST_HANG
    assert odd.describe() == ("rank 1 at faults.py:61 block_forever_in_host_call in "
                              "threading.py:327 wait (step 60, last collective #210 all_reduce)")
    assert odd.to_dict()["culprit_frame"]["function"] == "block_forever_in_host_call"
    assert len(odd.to_dict()["frames"]) == len(HOST_HANG)
    # torch's frames and the monitor's own wrapper are not the user's code either
    assert waiting.culprit == WAITING[1]
    assert waiting.describe().startswith("3 ranks at train.py:154 train_step in "
                                         "collectives.py:230 wrapper")


def test_the_report_shows_the_user_frame_and_every_frame_below_it():
    stack = (*HOST_HANG[:2], *(Frame(f"/app/trainer/deep{i}.py", i, "f") for i in range(6)),
             *HOST_HANG[2:])
    classes = tuple(merge([RankStack(1, 60, "", True, "", None, stack)]))
    lines = [text for kind, text in finding_lines(Finding("hang", "critical", "x",
                                                          stacks=classes)) if kind == "stack"]
    assert lines[1:] == ["      threading.py:327 wait", "      threading.py:629 wait",
                         "      faults.py:61 block_forever_in_host_call",
                         "      deep5.py:5 f"], lines


def test_a_stack_all_in_libraries_falls_back_to_its_innermost_frame():
    only_lib = (Frame(f"{LIB}/threading.py", 1, "run"), Frame(f"{LIB}/queue.py", 2, "get"))
    (c,) = merge([RankStack(0, 1, "", True, "", None, only_lib)])
    assert c.culprit == only_lib[-1] and c.describe().startswith("rank 0 at queue.py:2 get (")
