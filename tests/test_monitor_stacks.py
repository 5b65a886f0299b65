"""Stack evidence: a stalled rank's training-thread stack, phase, step and last collective,
served as /stacks beside /metrics; bounded, untrusted when read, absent when not stalled."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request

from support import free_port

from fsdpmon.monitor.server import PortKeeper
from fsdpmon.monitor.stacks import (
    MAX_FILE_BYTES,
    MAX_FRAMES,
    StackPublisher,
    job_stacks,
    stacks_app,
    thread_frames,
)
from fsdpmon.monitor.state import RankStateWriter


def next_batch_that_never_comes(entered: threading.Event, release: threading.Event) -> None:
    entered.set()
    release.wait()


def _blocked_thread() -> tuple[threading.Thread, threading.Event]:
    """A thread inside next_batch_that_never_comes until released (it says when it is)."""
    entered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=next_batch_that_never_comes, args=(entered, release),
                              daemon=True)
    thread.start()
    assert entered.wait(30), "the thread never started"
    return thread, release


def test_frames_are_the_threads_own_outermost_first() -> None:
    thread, release = _blocked_thread()
    try:
        frames = thread_frames(thread.ident)
    finally:
        release.set()
    functions = [f["function"] for f in frames]
    assert "next_batch_that_never_comes" in functions, functions
    assert functions.index("_bootstrap") < functions.index("next_batch_that_never_comes")
    mine = frames[functions.index("next_batch_that_never_comes")]
    assert mine["file"] == __file__ and mine["line"] > 0


def test_a_deep_stack_keeps_its_innermost_frames_and_stays_bounded() -> None:
    got: list = []

    def dig(n: int) -> None:
        if n:
            dig(n - 1)
        else:
            got.extend(thread_frames(threading.get_ident()))

    dig(400)
    assert len(got) == MAX_FRAMES, f"{len(got)} frames, bound {MAX_FRAMES}"
    assert got[-1]["function"] == "thread_frames" and got[-2]["function"] == "dig"


def _rank(directory, rank: int, stalled: bool) -> RankStateWriter:
    writer = RankStateWriter(directory, rank)
    writer.snapshot({"pid": os.getpid(), "rank": rank, "local_rank": rank, "job_name": "j"})
    writer.heartbeat(time.time() - 60, 7, 7, 700, 1.0 if stalled else 0.0, 30)
    return writer


def test_only_the_stalled_rank_publishes_and_the_document_has_the_agreed_shape(tmp_path):
    writers = [_rank(tmp_path, 0, stalled=True), _rank(tmp_path, 1, stalled=False)]
    thread, release = _blocked_thread()
    publisher = StackPublisher(tmp_path, 0, 0, thread.ident,
                               lambda: (7.0, "data", ("all_gather_into_tensor", 41)))
    try:
        before = time.time()
        publisher.publish()
        after = time.time()
        doc = json.loads(json.dumps(job_stacks(tmp_path, "j"), allow_nan=False))
        assert doc["job"] == "j" and [r["rank"] for r in doc["ranks"]] == [0, 1]
        hung, fine = doc["ranks"]
        assert set(hung) == {"rank", "local_rank", "pid", "step", "phase", "stalled",
                             "published_at", "last_collective", "frames"}
        assert hung["stalled"] and hung["step"] == 7 and hung["phase"] == "data"
        assert hung["last_collective"] == {"op": "all_gather_into_tensor", "seq": 41}
        assert hung["frames"][-2]["function"] == "next_batch_that_never_comes" or any(
            f["function"] == "next_batch_that_never_comes" for f in hung["frames"])
        assert before <= hung["published_at"] <= after, (before, hung["published_at"], after)
        assert not fine["stalled"] and fine["frames"] == [] and fine["last_collective"] is None
        publisher.clear()  # steps resumed
        assert job_stacks(tmp_path, "j")["ranks"][0]["frames"] == []
    finally:
        release.set()
        for w in writers:
            w.close()


def test_stack_files_are_untrusted(tmp_path):
    writer = _rank(tmp_path, 0, stalled=True)
    path = tmp_path / "stack0.json"
    try:
        for bad in (b"not json", b"[1, 2]", json.dumps({"pid": os.getpid() + 1}).encode(),
                    b"[" * 100000, b" " * (MAX_FILE_BYTES + 1)):
            path.write_bytes(bad)
            assert job_stacks(tmp_path, "j")["ranks"][0]["frames"] == [], bad[:20]
        path.write_text(json.dumps({
            "pid": os.getpid(), "step": "x", "phase": 3, "published_at": float("nan"),
            "last_collective": {"op": 1}, "frames": [{"file": "a", "line": 1, "function": "f"},
                                                    {"file": 2}, "x"] * 100}))
        rank = job_stacks(tmp_path, "j")["ranks"][0]
        assert rank["step"] is None and rank["phase"] is None and rank["published_at"] is None
        assert rank["last_collective"] is None and len(rank["frames"]) <= MAX_FRAMES
        assert all(f == {"file": "a", "line": 1, "function": "f"} for f in rank["frames"])
        json.dumps(job_stacks(tmp_path, "j"), allow_nan=False)
    finally:
        writer.close()


def test_stacks_are_served_beside_metrics_on_the_same_listener(tmp_path):
    writer = _rank(tmp_path, 0, stalled=True)
    thread, release = _blocked_thread()
    StackPublisher(tmp_path, 0, 0, thread.ident, lambda: (7.0, "forward", None)).publish()
    port = free_port()
    keeper = PortKeeper(tmp_path, "127.0.0.1", port, 0, 0.2,
                        routes={"/stacks": stacks_app(tmp_path, "j")})
    try:
        keeper.start()
        deadline = time.monotonic() + 10
        while not keeper.serving and time.monotonic() < deadline:
            time.sleep(0.05)
        assert keeper.serving, "not serving after 10 s"
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/stacks", timeout=5) as resp:
            assert resp.headers["Content-Type"] == "application/json"
            doc = json.loads(resp.read())
        assert doc["ranks"][0]["phase"] == "forward" and doc["ranks"][0]["frames"]
        with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
            assert b"fsdpmon_train_stalled" in resp.read()
    finally:
        release.set()
        keeper.close()
        writer.close()


def test_stacks_take_the_same_basic_auth_as_metrics(tmp_path):
    import base64
    import urllib.error

    import bcrypt

    from fsdpmon.webconfig import WebConfig

    writer = _rank(tmp_path, 0, stalled=False)
    port = free_port()
    web = WebConfig(users={"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))})
    keeper = PortKeeper(tmp_path, "127.0.0.1", port, 0, 0.2, web=web,
                        routes={"/stacks": stacks_app(tmp_path, "j")})

    def status(path: str, password: bytes | None) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        if password is not None:
            token = base64.b64encode(b"prometheus:" + password).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code

    try:
        keeper.start()
        deadline = time.monotonic() + 10
        while not keeper.serving and time.monotonic() < deadline:
            time.sleep(0.05)
        assert keeper.serving, "not serving after 10 s"
        for path in ("/stacks", "/metrics"):
            assert [status(path, None), status(path, b"wrong"), status(path, b"right")] == [
                401, 401, 200], path
    finally:
        keeper.close()
        writer.close()


def test_a_stalled_rank_captures_again_every_refresh_seconds(tmp_path):
    from fsdpmon.monitor.stacks import REFRESH_SECONDS

    now = [REFRESH_SECONDS]
    publisher = StackPublisher(tmp_path, 0, 0, threading.get_ident(),
                               lambda: (1.0, "data", None), clock=lambda: now[0])
    assert publisher.due(), "never published: due at once"
    publisher.publish()
    now[0] += REFRESH_SECONDS - 0.5
    assert not publisher.due()
    now[0] += 0.5
    assert publisher.due(), "exactly REFRESH_SECONDS later"
    publisher.clear()
    now[0] = REFRESH_SECONDS
    assert publisher.due() and not (tmp_path / "stack0.json").exists()


def _served(tmp_path, body: bytes) -> dict | None:
    """What /stacks serves of rank 0's stack file ``body`` (rank 0 stalled, this process)."""
    writer = _rank(tmp_path, 0, stalled=True)
    try:
        (tmp_path / "stack0.json").write_bytes(body)
        return job_stacks(tmp_path, "j")["ranks"][0]
    finally:
        writer.close()


def test_a_stack_file_is_read_up_to_its_bound_and_checked_field_by_field(tmp_path):
    doc = {"pid": os.getpid(), "step": 3, "phase": "data", "published_at": 1.0,
           "last_collective": {"op": "all_reduce"},  # no seq: no collective to show
           "frames": [{"file": "a.py", "line": 3, "function": "f"},
                      {"file": "b.py", "line": 4}]}  # no function: dropped
    text = json.dumps(doc).encode()
    exact = text + b" " * (MAX_FILE_BYTES - len(text))
    served = _served(tmp_path, exact)
    assert served["frames"] == [{"file": "a.py", "line": 3, "function": "f"}], served
    assert served["last_collective"] is None and served["step"] == 3, served
    assert _served(tmp_path, exact + b" ")["frames"] == [], "one byte over the bound: unread"
