"""A workload run B requests at a time through the batched cycle (engine/batch/), with continuous batching.

    python -m engine run --prompts FILE --batch B --out FOLDER

The folder is the one an unbatched workload writes (engine/workload/run.py): the manifest and one
ordinary trace per request, each run with the request's own seed (seed * SEED_STRIDE + i), so every
workload view, the statistics and the stepper read it as they read any workload. A request's trace
is its row's records of the batched cycles, written by the one driver (engine/cycle/driver.py) as for
any run; its header's "batch" names the batch's rows and the row it ran in, and its times are the
batch's. Continuous batching: a row whose request finished takes the next pending one at once (the
driver's admission: its prompt read alone), so the batch stays full while requests remain; a row with
nothing left to take stays idle, still in every forward, and the batch trace counts it.

The folder also holds batch.jsonl, the batch's own trace: a header, one line per batched cycle
(each row's request, accepted count and cache lengths, the idle rows, the time split, the requests
admitted) and a summary. engine/trace/batch_reader.py reads and checks it.
"""
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from engine.batch.cycle import run_batch, start_batch
from engine.batch.report import batch_cycle
from engine.batch.trace_lines import batch_cycle_record
from engine.config import SpecSettings
from engine.cycle.driver import Admission
from engine.cycle.pair import Pair
from engine.kv.layouts import run_capacity
from engine.mode import RunMode
from engine.run import make_header, run_summary
from engine.trace.batch_reader import BATCH_FORMAT, BATCH_TRACE, BATCH_VERSION
from engine.trace.writer import TraceWriter
from engine.workload import manifest as mf
from engine.workload.folder import Workload, open_folder
from engine.workload.prompts import Request
from engine.workload.run import encode_requests, new_manifest, start_folder, write_manifest


@dataclass
class RowRun:
    """The request a row is running: its trace as it grows."""

    index: int  # the request's index in the workload
    writer: TraceWriter
    started: float  # perf_counter at its admission: its wall time includes reading its prompt, as a single run's does
    cycles: list[dict] = field(default_factory=list)


@dataclass
class BatchedWorkload:
    """What every row's trace needs, and the manifest the run keeps up to date."""

    pair: Pair
    requests: list[Request]
    s: SpecSettings  # the workload's settings (static layout); each request runs with its own seed
    mode: RunMode  # the batch's run mode (RunMode.batch: the rows)
    folder: Path
    manifest: dict
    prompt_ids: list[list[int] | str]
    preset: str | None
    chat: bool
    rows: int
    capacity: int
    on_request: Callable[[mf.Entry], None] | None
    on_cycle: Callable[[dict], None] | None

    def settings_of(self, i: int) -> SpecSettings:
        return replace(self.s, seed=mf.request_seed(self.s.seed, i, self.manifest["seed_stride"]))

    def header(self, i: int, row: int) -> dict:
        r, ids = self.requests[i], self.prompt_ids[i]
        header = make_header(self.pair, self.settings_of(i), r.text, ids, self.preset, self.chat, self.mode)
        header["cache_layout"] = {"name": "static", "capacity": self.capacity}  # the batch's rows, not this prompt's
        if r.messages:
            header["messages"] = [{"role": role, "content": c} for role, c in r.messages]
        return header | {"request": {"id": r.id, "category": r.category}, "batch": {"rows": self.rows, "row": row}}

    def open_row(self, i: int, row: int) -> RowRun:
        writer = TraceWriter(self.folder / self.manifest["requests"][i]["file"])
        writer.write(self.header(i, row))
        return RowRun(i, writer, time.perf_counter())

    def finish_row(self, run: RowRun) -> None:
        summary = run_summary(self.pair, run.cycles, self.s.k, time.perf_counter() - run.started)
        run.writer.write(summary)
        run.writer.finish()
        entry = self.manifest["requests"][run.index]
        entry |= {"status": mf.DONE, "summary": mf.summary_of(summary, len(self.prompt_ids[run.index]))}
        write_manifest(self.folder, self.manifest)
        if self.on_request:
            self.on_request(mf.entry_of(entry))


def start_batched(pair: Pair, requests: list[Request], s: SpecSettings, folder: str | Path, mode: RunMode, *,
                  preset: str | None, chat_template: bool, prompts_name: str, skip_too_long: bool,
                  on_request, on_cycle) -> BatchedWorkload:
    """Check everything and write the manifest (every request pending, those too long skipped): nothing runs yet."""
    folder = Path(folder)
    chat = chat_template and bool(getattr(pair.target.tokenizer, "chat_template", None))
    mode.prepare(pair, s)  # the mode's and the drafter's refusals, as an unbatched run makes them
    s = mode.settings_for(s)  # each row is a static buffer (engine/kv/rows.py)
    manifest = new_manifest(pair, s, mode, preset, chat, requests, prompts_name)
    prompt_ids = encode_requests(pair, requests, s, chat, prompts_name, skip_too_long)
    runnable = [ids for ids in prompt_ids if isinstance(ids, list)]
    rows = min(mode.batch, max(1, len(runnable)))
    capacity = max((run_capacity(len(ids), s.k, s.max_new_tokens) for ids in runnable), default=1)
    manifest = start_folder(folder, manifest | {"batch": {"rows": rows}}, resume=False)
    for entry, ids in zip(manifest["requests"], prompt_ids):
        if isinstance(ids, str):
            entry |= {"status": mf.SKIPPED, "reason": ids}
    write_manifest(folder, manifest)
    return BatchedWorkload(pair, requests, s, mode, folder, manifest, prompt_ids, preset, chat, rows, capacity,
                           on_request, on_cycle)


def run_rows(w: BatchedWorkload, batch_writer: TraceWriter) -> None:
    """The batched cycles until every request has finished, each row's records into its request's trace,
    one batch trace line per cycle."""
    queue = deque(i for i, ids in enumerate(w.prompt_ids) if isinstance(ids, list))
    if not queue:
        return
    first = [queue.popleft() for _ in range(min(w.rows, len(queue)))]
    batch = start_batch(w.pair, [w.prompt_ids[i] for i in first], w.s, [w.settings_of(i).seed for i in first],
                        capacity=w.capacity, requests=first)
    running: dict[int, RowRun] = {i: w.open_row(i, row) for row, i in enumerate(first)}

    def admit(row: int) -> Admission | None:
        """The next pending request takes the finished row; its wall time starts here, its prompt's reading included."""
        if not queue:
            return None
        i = queue.popleft()
        running[i] = w.open_row(i, row)
        return Admission(w.prompt_ids[i], w.settings_of(i).seed, w.s.max_new_tokens, i)

    for done in run_batch(batch, record=True, admit=admit):
        for rec, i in zip(done.records, done.requests):
            if rec is None:
                continue
            run = running[i]
            run.writer.write(rec)
            run.cycles.append(rec)
            if w.on_cycle:
                w.on_cycle(rec)
            if rec["finished"]:
                w.finish_row(running.pop(i))
        admitted = [{"row": a.row, "request": a.request, "prompt_tokens": len(w.prompt_ids[a.request]),
                     "prefill_s": a.prefill_s} for a in done.admitted]
        ran = [None if step is None else i for i, step in zip(done.requests, done.steps)]  # an idle row runs none
        batch_writer.write(batch_cycle_record(batch_cycle(done), ran, admitted))


def run_batched_workload(pair: Pair, requests: list[Request], s: SpecSettings, folder: str | Path,
                         batch: int | RunMode, *,
                         preset: str | None = None, chat_template: bool = True, prompts_name: str = "prompts",
                         skip_too_long: bool = False, on_request: Callable[[mf.Entry], None] | None = None,
                         on_cycle: Callable[[dict], None] | None = None) -> Workload:
    """Run every request of the prompt file `batch` at a time, writing the workload folder and batch.jsonl."""
    mode = batch if isinstance(batch, RunMode) else RunMode(batch=batch)
    w = start_batched(pair, requests, s, folder, mode, preset=preset, chat_template=chat_template,
                      prompts_name=prompts_name, skip_too_long=skip_too_long, on_request=on_request, on_cycle=on_cycle)
    started = time.perf_counter()
    with TraceWriter(w.folder / BATCH_TRACE) as batch_writer:
        batch_writer.write({"type": "batch_header", "format": BATCH_FORMAT, "version": BATCH_VERSION,
                            "rows": w.rows, "capacity": w.capacity, "requests": len(requests),
                            "settings": w.s.to_dict(), "manifest": mf.MANIFEST})
        run_rows(w, batch_writer)
        done = [e for e in w.manifest["requests"] if e["status"] == mf.DONE]
        tokens = sum(e["summary"]["num_generated"] for e in done)
        wall = time.perf_counter() - started
        batch_writer.write({"type": "batch_summary", "requests_done": len(done), "num_generated": tokens,
                            "wall_time_s": wall, "tokens_per_s": tokens / wall if wall > 0 else 0.0})
    return open_folder(w.folder)
