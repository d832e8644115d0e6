"""A workload run B requests at a time through the batched cycle (engine/batch/), with continuous batching.

    python -m engine run --prompts FILE --batch B --out FOLDER

The folder is the one an unbatched workload writes (engine/workload/run.py): the manifest and one
ordinary trace per request, each run with the request's own seed (seed * SEED_STRIDE + i), so every
workload view, the statistics and the stepper read it as they read any workload. A request's trace
is its rows of the batched cycles (engine/batch/trace.py); its header's "batch" names the batch's
rows and the row it ran in, and its times are the batch's. Continuous batching: a row whose request
finished takes the next pending one at once (its prompt read alone, engine/batch/cycle.py
`admit_row`), so the batch stays full while requests remain; a row with nothing left to take stays
idle, still in every forward, and the batch trace counts it.

The folder also holds batch.jsonl, the batch's own trace: a header, one line per batched cycle
(each row's request, accepted count and cache lengths, the idle rows, the time split, the requests
admitted) and a summary. engine/trace/batch.py reads and checks it.
"""
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from engine.batch.cycle import BatchState, admit_row, check_batch_pair, run_batch_cycle, start_batch
from engine.batch.trace import RowLayout, batch_cycle_record, row_trace_record
from engine.config import SettingsError, SpecSettings
from engine.cycle.pair import Pair, TokenTexts
from engine.kv.layouts import run_capacity
from engine.mode import DEFAULT_MODE
from engine.run import make_header, run_summary
from engine.trace.batch import BATCH_FORMAT, BATCH_TRACE, BATCH_VERSION, MAX_BATCH
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
        header = make_header(self.pair, self.settings_of(i), r.text, ids, self.preset, self.chat, DEFAULT_MODE)
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


def check_batch_size(batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise SettingsError(f"--batch must be an integer from 1 to {MAX_BATCH}, got {batch!r}")


def start_batched(pair: Pair, requests: list[Request], s: SpecSettings, folder: str | Path, batch: int, *,
                  preset: str | None, chat_template: bool, prompts_name: str, skip_too_long: bool,
                  on_request, on_cycle) -> BatchedWorkload:
    """Check everything and write the manifest (every request pending, those too long skipped): nothing runs yet."""
    check_batch_size(batch)
    folder = Path(folder)
    s = replace(s, cache_layout="static")  # each row is a static buffer (engine/batch/cache.py)
    chat = chat_template and bool(getattr(pair.target.tokenizer, "chat_template", None))
    DEFAULT_MODE.prepare(pair, s)  # the drafter's own refusals, as an unbatched run makes them
    check_batch_pair(pair)
    manifest = new_manifest(pair, s, DEFAULT_MODE, preset, chat, requests, prompts_name)
    prompt_ids = encode_requests(pair, requests, s, chat, prompts_name, skip_too_long)
    runnable = [ids for ids in prompt_ids if isinstance(ids, list)]
    rows = min(batch, max(1, len(runnable)))
    capacity = max((run_capacity(len(ids), s.k, s.max_new_tokens) for ids in runnable), default=1)
    manifest = start_folder(folder, manifest | {"batch": {"rows": rows}}, resume=False)
    for entry, ids in zip(manifest["requests"], prompt_ids):
        if isinstance(ids, str):
            entry |= {"status": mf.SKIPPED, "reason": ids}
    write_manifest(folder, manifest)
    return BatchedWorkload(pair, requests, s, folder, manifest, prompt_ids, preset, chat, rows, capacity,
                           on_request, on_cycle)


def run_rows(w: BatchedWorkload, batch_writer: TraceWriter) -> None:
    """The batched cycles until every request has finished, each row's cycles into its request's trace."""
    queue = deque(i for i, ids in enumerate(w.prompt_ids) if isinstance(ids, list))
    if not queue:
        return
    first = [queue.popleft() for _ in range(min(w.rows, len(queue)))]
    state: BatchState = start_batch(w.pair, [w.prompt_ids[i] for i in first], w.s,
                                    [w.settings_of(i).seed for i in first], capacity=w.capacity)
    running: list[RowRun | None] = [w.open_row(i, row) for row, i in enumerate(first)]
    layouts = [RowLayout() for _ in first]
    texts, cycle = TokenTexts(w.pair.target.tokenizer), 0
    while not all(state.finished):
        c = run_batch_cycle(state, cycle, texts)
        ran = [None if run is None else run.index for run in running]
        admitted = []
        for row in c.rows:
            run = running[row.row]
            if row.idle or run is None:
                continue
            rec = row_trace_record(c, row, len(run.cycles), w.s.k, layouts[row.row], w.capacity)
            run.writer.write(rec)
            run.cycles.append(rec)
            if w.on_cycle:
                w.on_cycle(rec)
            if row.finished:
                w.finish_row(run)
                running[row.row] = None
                if queue:
                    admitted.append(admit(w, state, running, row.row, queue.popleft()))
        batch_writer.write(batch_cycle_record(c, ran, admitted))
        cycle += 1


def admit(w: BatchedWorkload, state: BatchState, running: list[RowRun | None], row: int, i: int) -> dict:
    """Request i takes row `row` (continuous batching); what the batch trace records of it."""
    started = time.perf_counter()
    running[row] = w.open_row(i, row)  # its wall time starts here, the prompt's reading included
    admit_row(state, row, w.prompt_ids[i], w.settings_of(i).seed, w.s.max_new_tokens)
    return {"row": row, "request": i, "prompt_tokens": len(w.prompt_ids[i]), "prefill_s": time.perf_counter() - started}


def run_batched_workload(pair: Pair, requests: list[Request], s: SpecSettings, folder: str | Path, batch: int, *,
                         preset: str | None = None, chat_template: bool = True, prompts_name: str = "prompts",
                         skip_too_long: bool = False, on_request: Callable[[mf.Entry], None] | None = None,
                         on_cycle: Callable[[dict], None] | None = None) -> Workload:
    """Run every request of the prompt file `batch` at a time, writing the workload folder and batch.jsonl."""
    w = start_batched(pair, requests, s, folder, batch, preset=preset, chat_template=chat_template,
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
