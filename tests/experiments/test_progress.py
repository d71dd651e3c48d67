"""The sweep's status: the time left from finished runs' durations, and `status.json`."""

from __future__ import annotations

import io
import json

from distill.experiments.run.tally import Progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_estimate_before_a_run_has_finished(tmp_path):
    out, clock = io.StringIO(), Clock()
    progress = Progress(3, out, jobs=2, status_path=tmp_path / "status.json", clock=clock)
    progress.begin("a")
    clock.now = 50
    progress.end("a", finished=False)  # failed: its duration says nothing
    progress.failed += 1
    progress.show()
    assert progress.seconds_left() is None
    assert "left (until" not in out.getvalue()
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["seconds_left"] is None and status["failed"] == 1 and status["left"] == 2


def test_time_left_deals_the_remaining_runs_to_the_job_slots(tmp_path):
    out, clock = io.StringIO(), Clock()
    progress = Progress(5, out, jobs=2, status_path=tmp_path / "status.json", clock=clock)
    progress.pending_kinds = ["fit"] * 5
    progress.begin("a")
    progress.begin("b")
    clock.now = 100.0
    progress.end("a", finished=True)  # a fit takes 100 s
    progress.done += 1
    progress.begin("c")
    clock.now = 120.0
    # b has 0 s of its mean left (it is overdue), c 80 s; two fits wait: slot b takes one
    # (0 + 100), slot c the other (80 + 100): the last ends in 180 s.
    assert progress.seconds_left() == 180.0
    progress.show()
    assert (
        out.getvalue()
        .splitlines()[-1]
        .startswith("[sweep] 1/5 done, 2 running, 2 left, 0 failed, about 3 min left (until ")
    )
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["seconds_left"] == 180 and status["running_runs"] == ["b", "c"]
    assert status["mean_run_seconds"] == {"fit": 100.0} and status["state"] == "running"
    progress.close()
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "ended"


def test_references_and_fits_are_estimated_by_kind():
    clock = Clock()
    progress = Progress(4, io.StringIO(), jobs=1, clock=clock)
    progress.pending_kinds = ["reference", "reference", "fit", "fit"]
    progress.begin("start", "reference")
    clock.now = 10.0
    progress.end("start", finished=True)
    progress.done += 1
    # Only a reference has finished: every kind takes its 10 s until a fit finishes.
    assert progress.seconds_left() == 30.0
    progress.begin("teacher", "reference")
    clock.now = 20.0
    progress.end("teacher", finished=True)
    progress.done += 1
    progress.begin("fit-1", "fit")
    clock.now = 320.0
    progress.end("fit-1", finished=True)
    progress.done += 1
    assert progress.seconds_left() == 300.0  # one fit left, at the fits' 300 s, not 10 s


def test_the_status_file_is_refreshed_between_events(tmp_path):
    clock = Clock()
    progress = Progress(2, io.StringIO(), status_path=tmp_path / "status.json", clock=clock)
    progress.pending_kinds = ["fit", "fit"]
    progress.begin("a")
    clock.now = 60.0
    progress.end("a", finished=True)
    progress.done += 1
    progress.begin("b")
    assert json.loads((tmp_path / "status.json").read_text())["seconds_left"] == 60
    clock.now = 65.0
    progress.tick()  # within REFRESH_S of the last write: nothing rewritten
    assert json.loads((tmp_path / "status.json").read_text())["seconds_left"] == 60
    clock.now = 75.0
    progress.tick()
    assert json.loads((tmp_path / "status.json").read_text())["seconds_left"] == 45
