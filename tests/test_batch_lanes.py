"""The Workload page's batch lanes (app/figures/batch.py) against the engine's records of a batched workload."""
import json

import pytest

from app.figures import batch as figs
from app.figures.style import ACCEPTED, BONUS, DISCARDED, REJECTED, RESAMPLED
from engine.config import SpecSettings
from engine.trace import TraceError
from engine.trace.batch_reader import BATCH_TRACE
from engine.workload.batched import run_batched_workload
from engine.workload.folder import open_workload, open_zip, zip_folder
from tests.test_batch_workload import MORE
from tests.test_workload_run import requests_of
from tests.tiny import noisy_pair

HOSTILE_ID = [dict(MORE[0], id="<b>r1</b>")] + MORE[1:]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("batched") / "w"
    run_batched_workload(noisy_pair(5, noise=0.05), requests_of(HOSTILE_ID), SpecSettings(k=3, temperature=0.9, seed=2,
                         max_new_tokens=8), out, batch=2, chat_template=False)
    return out


def test_every_lane_shows_what_its_requests_own_trace_recorded_at_that_cycle(folder):
    workload = open_workload(folder)
    batch = workload.batch_trace()
    k = batch["header"]["settings"]["k"]
    traces = {e.index: workload.trace(e) for e in workload.done}
    seen = {i: 0 for i in traces}
    for n, c in enumerate(batch["cycles"]):
        for row in c["rows"]:
            lane = figs.lane_cells(row, k)
            if row["idle"]:
                assert lane == [figs.IDLE] * (k + 1)
                continue
            own = traces[row["request"]].cycles[figs.request_cycle(batch, n, row["request"])]
            assert figs.request_cycle(batch, n, row["request"]) == seen[row["request"]]
            seen[row["request"]] += 1
            a = own["num_accepted"]
            assert lane[:a] == [ACCEPTED] * a
            if own["rejected_position"] is None:
                assert lane[k] == BONUS and a == k
            else:
                assert lane[a] == REJECTED and lane[a + 1:k] == [DISCARDED] * (k - a - 1) and lane[k] == RESAMPLED
            assert row["committed"] == len(own["committed_token_ids"])
            assert row["target_cache_len"]["after_rollback"] == own["target_cache_len"]["after_rollback"]
    assert seen == {i: len(t.cycles) for i, t in traces.items()}  # every cycle of every request is a lane once


def test_the_figure_draws_one_cell_per_lane_position_and_escapes_request_ids(folder):
    workload = open_workload(folder)
    batch = workload.batch_trace()
    k = batch["header"]["settings"]["k"]
    ids = {e.index: e.id for e in workload.entries}
    for n in range(len(batch["cycles"])):
        fig = figs.lanes_figure(batch, n, ids)
        bars = [t for t in fig.data if t.type == "bar"]
        assert sum(len(t.y) for t in bars) == batch["header"]["rows"] * (k + 1)
        names = {y for t in bars for y in t.y}
        assert all("<b>" not in name for name in names)
    first = figs.lanes_figure(batch, 0, ids)
    assert any("&lt;b&gt;r1&lt;/b&gt;" in y for t in first.data if t.type == "bar" for y in t.y)


def test_the_zip_carries_the_batch_trace_and_a_broken_one_is_refused(folder, tmp_path):
    zipped = open_zip(zip_folder(folder), "w.zip")
    assert zipped.batch_trace()["accepted"] == open_workload(folder).batch_trace()["accepted"]
    lines = (folder / BATCH_TRACE).read_text().splitlines()
    c = json.loads(lines[1])
    c["rows"][0]["num_accepted"] = (c["rows"][0]["num_accepted"] or 0) ^ 1 if not c["rows"][0]["idle"] else 0
    broken = tmp_path / "w"
    broken.mkdir()
    for f in folder.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / BATCH_TRACE).write_text("\n".join([lines[0], json.dumps(c), *lines[2:]]) + "\n")
    with pytest.raises(TraceError):
        open_workload(broken).batch_trace()
