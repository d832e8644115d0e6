"""A generator of hostile traces, each labelled with what the loader must do with it.

Every case starts from a real trace (tiny-model runs written by the engine, and bundled
ones) and changes it in one way. The label is decided here, from the change, never by
asking the checker:
- VALID: still a correct trace (re-encoded, odd but legal text, unknown extra fields);
- PARTIAL: a killed run, valid only when incomplete traces are allowed;
- INVALID: truncated, retyped, out of range, inconsistent, huge or deeply nested.
"""
import copy
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from engine.trace.format import CACHE_LEN_FIELDS, CYCLE_FIELDS, HEADER_FIELDS, SETTINGS_FIELDS, SUMMARY_FIELDS

VALID, PARTIAL, INVALID = "valid", "partial", "invalid"


@dataclass
class Case:
    name: str
    category: str
    expect: str  # VALID, PARTIAL or INVALID
    data: bytes
    max_bytes: int | None = None  # a smaller size limit for the "huge" cases
    meta: dict = field(default_factory=dict)


@dataclass
class Base:
    """A correct trace as records."""

    name: str
    header: dict
    cycles: list[dict]
    summary: dict

    @classmethod
    def read(cls, name: str, path: Path) -> "Base":
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
        remember(records[1:-1])
        return cls(name, records[0], records[1:-1], records[-1])

    def records(self) -> list[dict]:
        return [self.header, *self.cycles, self.summary]

    @property
    def k(self) -> int:
        return self.header["settings"]["k"]


_DUMPED: dict[int, tuple[dict, str]] = {}  # id of an unedited base cycle -> (that cycle, its JSON)


def remember(cycles: list[dict]) -> None:
    for c in cycles:
        _DUMPED[id(c)] = (c, json.dumps(c, ensure_ascii=False))


def dump(records: list[dict], ensure_ascii: bool = False, newline: str = "\n") -> bytes:
    def one(r: dict) -> str:
        known = _DUMPED.get(id(r))
        if known is not None and known[0] is r and not ensure_ascii:
            return known[1]
        return json.dumps(r, ensure_ascii=ensure_ascii)
    return "".join(one(r) + newline for r in records).encode("utf-8")


class CopyOnRead(list):
    """The base's cycles; a cycle is deep-copied the first time an edit indexes it, so unedited
    cycles stay the base's own objects (and keep their cached JSON)."""

    def __init__(self, items: list[dict]) -> None:
        super().__init__(items)
        self.copied: set[int] = set()

    def __getitem__(self, i):
        if isinstance(i, slice):
            return super().__getitem__(i)
        j = i % len(self)
        if j not in self.copied:
            super().__setitem__(j, copy.deepcopy(super().__getitem__(j)))
            self.copied.add(j)
        return super().__getitem__(j)


def mutated(base: Base, edit) -> list[dict]:
    """The records with `edit(header, cycles, summary)` applied to copies; the base stays as it was."""
    h, cs, s = copy.deepcopy(base.header), CopyOnRead(base.cycles), copy.deepcopy(base.summary)
    edit(h, cs, s)
    return [h, *cs, s]


# ---------------------------------------------------------------- valid variants

def set_text_everywhere(records: list[dict], token: int, text: str) -> None:
    """Give one token id a new text in every place it is written (still consistent)."""
    h = records[0]
    h["prompt_token_texts"] = [text if t == token else x for t, x in zip(h["prompt_token_ids"], h["prompt_token_texts"])]
    for c in records[1:-1]:
        for ids, texts in (("draft_token_ids", "draft_token_texts"), ("committed_token_ids", "committed_token_texts")):
            c[texts] = [text if t == token else x for t, x in zip(c[ids], c[texts])]
        nxt = c["resampled_token_id"] if c["resampled_token_id"] is not None else c["bonus_token_id"]
        if nxt == token:
            c["next_token_text"] = text
        for row in [*c["target_top"], *c["draft_top"], c["residual_top"] or []]:
            for e in row if isinstance(row, list) else [row]:
                if e["token_id"] == token:
                    e["text"] = text
        state = c.get("drafter_state") or {}
        if "target_token_ids" in state:  # other tokenizer: the re-encoded proposal, with its texts
            state["target_token_texts"] = [text if t == token else x
                                           for t, x in zip(state["target_token_ids"], state["target_token_texts"])]


ODD_TEXTS = ["a\u2028b", "\u2029", "x\x85y", "<script>alert(1)</script>", "\ufeff", "\r", "😀\u200d", "\\n"]


def valid_cases(base: Base, rng: random.Random) -> list[Case]:
    recs = base.records()
    out = [Case("identity", "valid", VALID, dump(recs)),
           Case("bom", "valid", VALID, b"\xef\xbb\xbf" + dump(recs)),
           Case("crlf", "valid", VALID, dump(recs, newline="\r\n")),
           Case("ascii", "valid", VALID, dump(recs, ensure_ascii=True)),
           Case("blank-lines", "valid", VALID, b"\n" + dump(recs).replace(b"\n", b"\n\n"))]
    token = base.cycles[0]["committed_token_ids"][0]
    for i, text in enumerate(ODD_TEXTS):
        edited = copy.deepcopy(recs)
        set_text_everywhere(edited, token, text)
        out.append(Case(f"odd-text-{i}", "valid", VALID, dump(edited)))
        out.append(Case(f"odd-text-ascii-{i}", "valid", VALID, dump(edited, ensure_ascii=True)))

    def extras(h, cs, s):
        h["drafter_notes"] = {"anything": [1, 2, {"deep": [[[1]]]}]}
        h["cache_layout"] = {"name": "dynamic"}
        for i in range(len(cs)):  # indexing copies the cycle before the edit
            cs[i]["layout"] = {"write_position": 3, "blocks": [[0, 1], [2]]}
        s["extra"] = None
    out.append(Case("unknown-fields", "valid", VALID, dump(mutated(base, extras))))
    out.append(Case("target-empty", "valid", VALID, dump(mutated(base, lambda h, c, s: h.update(target={}, draft={})))))
    out.append(Case("no-preset", "valid", VALID, dump(mutated(base, lambda h, c, s: h.pop("preset", None)))))
    out.append(Case("preset-unknown", "valid", VALID, dump(mutated(base, lambda h, c, s: h.update(preset="../../etc")))))
    out.append(Case("names-are-paths", "valid", VALID, dump(mutated(base, lambda h, c, s: (
        h["target"].update(name="/etc"), h["draft"].update(name="/no/such/dir"), h.update(preset=None))))))
    out.append(Case("no-calibration", "valid", VALID, dump(mutated(base, lambda h, c, s: h.pop("calibration", None)))))
    out.append(Case("tensor-parallel", "valid", VALID, dump(mutated(base, lambda h, c, s: h.update(
        tensor_parallel=rank_layout(4, host="<b>**node**</b>`$x$`"))))))
    out.append(Case("nested-16", "valid", VALID, dump(mutated(base, lambda h, c, s: h.update(x=nest(14))))))
    return out


def partial_cases(base: Base) -> list[Case]:
    recs = base.records()
    lines = dump(recs).split(b"\n")
    n = len(base.cycles)
    out = [Case("no-summary", "truncated", PARTIAL, b"\n".join(lines[:-2]) + b"\n"),
           Case("header-only", "truncated", PARTIAL, lines[0] + b"\n")]
    for cut in sorted({1, n // 2, n}):
        line = lines[cut]
        out.append(Case(f"cut-line-{cut}", "truncated", PARTIAL, b"\n".join(lines[:cut]) + b"\n" + line[: len(line) // 2]))
    return out


def nest(depth: int):
    value = 0
    for _ in range(depth):
        value = [value]
    return value


# ---------------------------------------------------------------- invalid: types and structure

def wrong_values(allowed: tuple) -> list:
    """JSON values of a type the field does not allow."""
    candidates = ["text", [1], {"a": 1}, True, 2.5, 7]
    if None not in allowed:
        candidates.append(None)

    def ok(v):
        if v is None:
            return False
        if isinstance(v, bool):
            return bool in allowed
        return any(isinstance(v, t) for t in allowed if t is not None)
    return [v for v in candidates if not ok(v)]


def retype_cases(base: Base, rng: random.Random, n: int) -> list[Case]:
    places = ([("header", name, allowed) for name, allowed in HEADER_FIELDS.items() if name != "type"]
              + [("settings", name, allowed) for name, allowed in SETTINGS_FIELDS.items()]
              + [("cycle", name, allowed) for name, allowed in CYCLE_FIELDS.items() if name != "type"]
              + [("cache", name, allowed) for name, allowed in CACHE_LEN_FIELDS.items()]
              + [("summary", name, allowed) for name, allowed in SUMMARY_FIELDS.items() if name != "type"])
    out = []
    for i in range(n):
        where, name, allowed = rng.choice(places)
        value = rng.choice(wrong_values(allowed))
        ci = rng.randrange(len(base.cycles))

        def edit(h, cs, s, where=where, name=name, value=value, ci=ci):
            target = {"header": h, "settings": h["settings"], "cycle": cs[ci], "summary": s,
                      "cache": cs[ci][rng.choice(["target_cache_len", "draft_cache_len"])]}[where]
            target[name] = value
        out.append(Case(f"retype-{where}-{name}-{i}", "retyped", INVALID, dump(mutated(base, edit))))
        drop_where, drop_name, _ = rng.choice(places)

        def drop(h, cs, s, where=drop_where, name=drop_name, ci=ci):
            target = {"header": h, "settings": h["settings"], "cycle": cs[ci], "summary": s,
                      "cache": cs[ci]["target_cache_len"]}[where]
            target.pop(name)
        out.append(Case(f"missing-{drop_where}-{drop_name}-{i}", "retyped", INVALID, dump(mutated(base, drop))))
    out.append(Case("numeric-model-name", "retyped", INVALID,
                    dump(mutated(base, lambda h, c, s: h["target"].update(name=12345)))))
    return out


def structure_cases(base: Base) -> list[Case]:
    recs = base.records()
    text = dump(recs)
    lines = text.split(b"\n")
    return [
        Case("empty", "structure", INVALID, b""),
        Case("whitespace", "structure", INVALID, b"  \n\n\t\n"),
        Case("binary", "structure", INVALID, bytes(range(256))),
        Case("latin1", "structure", INVALID, "caf\u00e9".encode("latin-1")),
        Case("array-line", "structure", INVALID, b"[1, 2]\n" + text),
        Case("two-headers", "structure", INVALID, lines[0] + b"\n" + text),
        Case("after-summary", "structure", INVALID, text + lines[1] + b"\n"),
        Case("unknown-type", "structure", INVALID, text.replace(b'"type": "cycle"', b'"type": "cycles"', 1)),
        Case("header-last", "structure", INVALID, b"\n".join(lines[1:-1] + [lines[0]]) + b"\n"),
        Case("cycles-reordered", "inconsistent", INVALID, b"\n".join([lines[0], lines[2], lines[1], *lines[3:]])),
        Case("cycle-dropped", "inconsistent", INVALID, b"\n".join([lines[0], *lines[2:]])),
        Case("cycle-duplicated", "inconsistent", INVALID, b"\n".join([lines[0], lines[1], *lines[1:]])),
        Case("u2028-line-break", "structure", INVALID, text.replace(b"\n", "\u2028".encode(), 1)),
    ]


# ---------------------------------------------------------------- invalid: numbers

def number_cases(base: Base) -> list[Case]:
    out = []
    text = dump(base.records()).decode()
    for literal in ("1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1" * 5000):
        out.append(Case(f"number-{literal[:8]}", "non-finite", INVALID,
                        text.replace('"verify_time_s": ', f'"verify_time_s": {literal}, "was": ', 1).encode()))
        out.append(Case(f"number-extra-{literal[:8]}", "non-finite", INVALID,
                        text.replace('"type": "header"', f'"type": "header", "extra": {literal}', 1).encode()))
    return out


OUT_OF_RANGE = [
    ("target_cache_len", "before", [-5, 10**12]), ("target_cache_len", "after_append", [-1, 10**12]),
    ("target_cache_len", "after_rollback", [-5, 10**12]), ("draft_cache_len", "before", [-5, 10**12]),
    ("draft_cache_len", "after_append", [-5, 10**12]), ("draft_cache_len", "after_rollback", [-5, 10**12]),
]


def range_cases(base: Base, rng: random.Random) -> list[Case]:
    k = base.k
    out = []
    edits = []
    for ci in [len(base.cycles) // 2]:
        for name, key, values in OUT_OF_RANGE:
            for v in values:
                edits.append((f"{name}.{key}={v}@{ci}",
                              lambda h, cs, s, ci=ci, name=name, key=key, v=v: cs[ci][name].update({key: v})))
        for v in (0, -1, k + 5, 10**12):
            edits.append((f"rejected_position={v}@{ci}", lambda h, cs, s, ci=ci, v=v: cs[ci].update(rejected_position=v)))
        for v in (-1, k + 1, 10**12):
            edits.append((f"num_accepted={v}@{ci}", lambda h, cs, s, ci=ci, v=v: cs[ci].update(num_accepted=v)))
        for name in ("p_draft", "p_target", "accept_prob", "beta"):
            for v in (1.5, -0.2, 1e300):
                edits.append((f"{name}=~{v}@{ci}", lambda h, cs, s, ci=ci, name=name, v=v: cs[ci][name].__setitem__(0, v)))
        for v in (-0.1, 1.0, 7.0):
            edits.append((f"u={v}@{ci}", lambda h, cs, s, ci=ci, v=v: cs[ci]["u"].__setitem__(0, v)))
        for v in (-1, 10**12):
            edits.append((f"draft-token={v}@{ci}", lambda h, cs, s, ci=ci, v=v: cs[ci]["draft_token_ids"].__setitem__(0, v)))
        for v in (10**7, 0, -3):
            edits.append((f"verify_positions={v}@{ci}", lambda h, cs, s, ci=ci, v=v: cs[ci].update(verify_positions=v)))
        for name in ("draft_time_s", "verify_time_s", "cycle_time_s"):
            edits.append((f"{name}<0@{ci}", lambda h, cs, s, ci=ci, name=name: cs[ci].update({name: -1.0})))
        edits.append((f"step-times-long@{ci}", lambda h, cs, s, ci=ci: cs[ci]["draft_step_times_s"].extend([0.0] * 10**4)))
        edits.append((f"cycle-number@{ci}", lambda h, cs, s, ci=ci: cs[ci].update(cycle=cs[ci]["cycle"] + 10**9)))
    for name, values in (("k", [0, -1, 33, 10**12]), ("temperature", [-1.0, 1e308, 101]), ("top_p", [0.0, 2.0, -1]),
                         ("top_k", [-1, 10**12]), ("max_new_tokens", [0, 10**9]), ("trace_top_k", [0, 10**6]),
                         ("seed", [-1, 2**70])):
        for v in values:
            edits.append((f"settings.{name}={v}", lambda h, cs, s, name=name, v=v: h["settings"].update({name: v})))
    edits += [
        ("prompt-empty", lambda h, cs, s: h.update(prompt_token_ids=[], prompt_token_texts=[])),
        ("prompt-token-negative", lambda h, cs, s: h["prompt_token_ids"].__setitem__(0, -1)),
        ("token-huge-without-vocab", lambda h, cs, s: (h.update(target={}), h["eos_token_ids"].append(2**40))),
        ("eos-huge", lambda h, cs, s: h.update(eos_token_ids=[10**12])),
        ("vocab-zero", lambda h, cs, s: h["target"].update(vocab_size=0)),
        ("convention-other", lambda h, cs, s: h["cache_convention"].update(name="full")),
        ("calibration-huge-width", lambda h, cs, s: h.update(calibration=calibration([10**7], [0.01]))),
        ("calibration-duplicate", lambda h, cs, s: h.update(calibration=calibration([2, 2], [0.01, 0.02]))),
        ("calibration-zero-time", lambda h, cs, s: h.update(calibration=calibration([1, 2], [0.0, 0.02]))),
        ("calibration-negative", lambda h, cs, s: h.update(calibration=calibration([1, 2], [0.01, 0.02], step=-1.0))),
        ("calibration-mismatch", lambda h, cs, s: h.update(calibration=calibration([1, 2, 3], [0.01, 0.02]))),
        ("calibration-retyped", lambda h, cs, s: h.update(calibration=calibration(["1"], [0.01]))),
        ("calibration-list", lambda h, cs, s: h.update(calibration=[1, 2])),
        ("calibration-capture-without-fast-path", lambda h, cs, s: h.update(
            calibration={**calibration([1, 2], [0.01, 0.02]), "capture": "compile"})),
        ("tp-list", lambda h, cs, s: h.update(tensor_parallel=[0, 1])),
        ("tp-world-zero", lambda h, cs, s: h.update(tensor_parallel={**rank_layout(2), "world_size": 0})),
        ("tp-size-not-dividing", lambda h, cs, s: h.update(tensor_parallel={**rank_layout(4), "tp_size": 3})),
        ("tp-ranks-missing", lambda h, cs, s: h.update(tensor_parallel={**rank_layout(4), "ranks": rank_layout(3)["ranks"]})),
        ("tp-ranks-out-of-order", lambda h, cs, s: h.update(tensor_parallel=rank_layout(2, order=[1, 0]))),
        ("tp-host-huge", lambda h, cs, s: h.update(tensor_parallel=rank_layout(2, host="h" * 10**5))),
        ("tp-device-retyped", lambda h, cs, s: h.update(tensor_parallel=rank_layout(2, device=3))),
        ("tp-backend-empty", lambda h, cs, s: h.update(tensor_parallel={**rank_layout(2), "backend": ""})),
        ("tp-drafter-rank-outside", lambda h, cs, s: h.update(tensor_parallel={**rank_layout(2), "drafter_rank": 2})),
        ("target-weights-unknown", lambda h, cs, s: h.update(target_weights={"path": "int3"})),
        ("target-weights-types", lambda h, cs, s: h.update(target_weights={
            "path": "int4", "file": "x.gguf", "tensor_types": {"Q4_K": 3}, "float_layers": 0, "weight_bytes": 1})),
        ("target-weights-file-long", lambda h, cs, s: h.update(target_weights={
            "path": "int4", "file": "x" * 10**4, "tensor_types": {"Q4_1": 3}, "float_layers": 0, "weight_bytes": 1})),
        ("target-weights-activations-lie", lambda h, cs, s: h.update(target_weights={
            "path": "int4-a8", "activations": "float32", "file": "x.gguf", "tensor_types": {"Q4_1": 3},
            "float_layers": 0, "weight_bytes": 1})),
        ("faults-unknown", lambda h, cs, s: h.update(faults={"drop_everything": True})),
        ("faults-rule-unknown", lambda h, cs, s: h.update(faults={"acceptance_rule": "always"})),
        ("faults-retyped", lambda h, cs, s: h.update(faults={"keep_rejected_kv": "yes"})),
        ("faults-tree-in-chain", lambda h, cs, s: h.update(faults={"crop_instead_of_compact": True})),
        ("summary-per-position-long", lambda h, cs, s: s.update(per_position_acceptance=[0.0] * 10**4)),
        ("summary-negative-wall", lambda h, cs, s: s.update(wall_time_s=-1.0)),
    ]
    for name, edit in edits:
        out.append(Case(f"range-{name}", "out-of-range", INVALID, dump(mutated(base, edit))))
    return out


def rank_layout(world: int, host: str = "node-1", device="cpu", order: list[int] | None = None) -> dict:
    """A tensor-parallel header entry as engine/parallel_run.py writes it."""
    ranks = [{"rank": r, "local_rank": r, "host": host, "device": device} for r in (order or range(world))]
    return {"world_size": world, "tp_size": world, "backend": "gloo", "drafter_rank": 0, "ranks": ranks}


def calibration(widths, times, step=0.01) -> dict:
    return {"cache_len": 10, "repeats": 3, "threads": 1, "target_step_s": step, "draft_step_s": 0.001,
            "verify_positions": widths, "verify_s": times}


# ---------------------------------------------------------------- invalid: inconsistent numbers

def other_token(base: Base, avoid: int) -> int:
    vocab = base.header["target"].get("vocab_size") or 16
    return (avoid + 1) % vocab


def moved_acceptance_rate(h: dict, cs: list[dict], s: dict) -> None:
    """An edit: the summary's acceptance rate 0.1 away from what its cycles say."""
    s.update(acceptance_rate=s["acceptance_rate"] + (0.1 if s["acceptance_rate"] < 0.5 else -0.1))


def moved_first_position_rate(h: dict, cs: list[dict], s: dict) -> None:
    """An edit: the summary's acceptance rate at position 1 far from what its cycles say."""
    s["per_position_acceptance"][0] = 0.999 if s["per_position_acceptance"][0] < 0.5 else 0.001


def inconsistent_cases(base: Base, rng: random.Random) -> list[Case]:
    k, cycles = base.k, base.cycles
    rejected = [i for i, c in enumerate(cycles) if c["num_accepted"] < k]
    accepted = [i for i, c in enumerate(cycles) if c["num_accepted"] > 0]
    picks = sorted({0, len(cycles) - 1})
    edits = []
    for ci in picks:
        c = cycles[ci]
        edits += [
            (f"committed-extra@{ci}", lambda h, cs, s, ci=ci: (cs[ci]["committed_token_ids"].append(1),
                                                               cs[ci]["committed_token_texts"].append("x"))),
            (f"committed-swapped@{ci}", lambda h, cs, s, ci=ci: cs[ci]["committed_token_ids"].__setitem__(
                -1, other_token(base, cs[ci]["committed_token_ids"][-1]))),
            (f"committed_len_before+1@{ci}",
             lambda h, cs, s, ci=ci: cs[ci].update(committed_len_before=cs[ci]["committed_len_before"] + 1)),
            (f"finished-flipped@{ci}", lambda h, cs, s, ci=ci: cs[ci].update(finished=not cs[ci]["finished"])),
            (f"catch-up-flipped@{ci}", lambda h, cs, s, ci=ci: cs[ci].update(draft_catch_up=not cs[ci]["draft_catch_up"])),
            (f"num_accepted-moved@{ci}", lambda h, cs, s, ci=ci: cs[ci].update(
                num_accepted=cs[ci]["num_accepted"] + (1 if cs[ci]["num_accepted"] < k else -1))),
            (f"text-changed-once@{ci}", lambda h, cs, s, ci=ci: cs[ci]["committed_token_texts"].__setitem__(
                0, cs[ci]["committed_token_texts"][0] + "\u2028changed")),
        ]
        nxt = c["resampled_token_id"] if c["resampled_token_id"] is not None else c["bonus_token_id"]
        if nxt in c["committed_token_ids"]:  # its text is written twice in this cycle
            edits.append((f"next-text-changed@{ci}", lambda h, cs, s, ci=ci: cs[ci].update(
                next_token_text=cs[ci]["next_token_text"] + "#")))
        if c["num_accepted"] >= 1:  # an accepted draft token is committed: changing it breaks the commit
            edits.append((f"draft-token-changed@{ci}", lambda h, cs, s, ci=ci: cs[ci]["draft_token_ids"].__setitem__(
                0, other_token(base, cs[ci]["draft_token_ids"][0]))))
        for name in ("target_cache_len", "draft_cache_len"):
            for key in ("before", "after_append", "after_rollback"):
                edits.append((f"{name}.{key}+1@{ci}", lambda h, cs, s, ci=ci, name=name, key=key:
                              cs[ci][name].update({key: cs[ci][name][key] + 1})))
        p_t, p_d = c["p_target"][0], c["p_draft"][0]
        if c["accept_prob"][0] > 1e-3:
            edits.append((f"accept_prob-halved@{ci}", lambda h, cs, s, ci=ci: cs[ci]["accept_prob"].__setitem__(
                0, cs[ci]["accept_prob"][0] / 2)))
        else:
            edits.append((f"accept_prob-raised@{ci}", lambda h, cs, s, ci=ci: cs[ci]["accept_prob"].__setitem__(0, 0.5)))
        if p_t > 1e-3 and p_t / 2 < p_d * (1 - 1e-3):  # the ratio drops below 1, so accept_prob disagrees
            edits.append((f"p_target-halved@{ci}", lambda h, cs, s, ci=ci: cs[ci]["p_target"].__setitem__(
                0, cs[ci]["p_target"][0] / 2)))
        if min(p_t, p_d) > 1e-3:
            edits.append((f"beta-below-overlap@{ci}", lambda h, cs, s, ci=ci: cs[ci]["beta"].__setitem__(
                0, min(cs[ci]["p_target"][0], cs[ci]["p_draft"][0]) / 2)))
        if c["draft_top"][0]:
            edits.append((f"draft_top-ascending@{ci}", lambda h, cs, s, ci=ci: cs[ci]["draft_top"][0].insert(
                0, {**cs[ci]["draft_top"][0][-1], "p": cs[ci]["draft_top"][0][-1]["p"] / 2})))
        edits.append((f"target_top-sum>1@{ci}", lambda h, cs, s, ci=ci: cs[ci]["target_top"].__setitem__(
            0, [{"token_id": 1, "text": t_text(cs, 1), "p": 0.9}, {"token_id": 2, "text": t_text(cs, 2), "p": 0.8}])))
        edits.append((f"bonus-and-resampled@{ci}", lambda h, cs, s, ci=ci: cs[ci].update(
            bonus_token_id=cs[ci]["resampled_token_id"], resampled_token_id=cs[ci]["bonus_token_id"])))
        edits.append((f"u-dropped@{ci}", lambda h, cs, s, ci=ci: cs[ci]["u"].pop()))
    rule = (base.header.get("faults") or {}).get("acceptance_rule", "ratio")
    if rule in ("ratio", "no_residual"):
        for ci in rejected[:3]:
            n = cycles[ci]["num_accepted"]
            if cycles[ci]["accept_prob"][n] > 0:
                edits.append((f"u-says-accept@{ci}", lambda h, cs, s, ci=ci, n=n: cs[ci]["u"].__setitem__(
                    n, cs[ci]["accept_prob"][n] / 2)))
        for ci in accepted[:3]:
            if cycles[ci]["accept_prob"][0] < 1.0:
                edits.append((f"u-says-reject@{ci}", lambda h, cs, s, ci=ci: cs[ci]["u"].__setitem__(
                    0, (1 + cs[ci]["accept_prob"][0]) / 2)))
    for ci in rejected[:2]:
        edits.append((f"residual-dropped@{ci}", lambda h, cs, s, ci=ci: cs[ci].update(residual_top=None)))
        edits.append((f"residual-without-sample@{ci}", lambda h, cs, s, ci=ci: cs[ci].update(residual_top=[
            e for e in cs[ci]["residual_top"] if e["token_id"] != cs[ci]["resampled_token_id"]])))
    edits += [
        ("summary-ids", lambda h, cs, s: s["generated_token_ids"].append(1)),
        ("summary-num_generated", lambda h, cs, s: s.update(num_generated=s["num_generated"] + 1)),
        ("summary-num_cycles", lambda h, cs, s: s.update(num_cycles=s["num_cycles"] + 1)),
        ("summary-rate", moved_acceptance_rate),
        ("summary-length", lambda h, cs, s: s.update(mean_acceptance_length=s["mean_acceptance_length"] + 0.5)),
        ("summary-per-position", moved_first_position_rate),
        ("summary-stop", lambda h, cs, s: s.update(stop_reason="eos" if s["stop_reason"] != "eos" else "max_new_tokens")),
        ("summary-tokens_per_s", lambda h, cs, s: s.update(tokens_per_s=s["tokens_per_s"] * 2 + 1)),
        ("budget-lowered", lambda h, cs, s: h["settings"].update(max_new_tokens=max(1, s["num_generated"] - 1))),
        ("prompt-longer", lambda h, cs, s: (h["prompt_token_ids"].append(1), h["prompt_token_texts"].append(t_text(cs, 1)))),
        ("k-changed", lambda h, cs, s: h["settings"].update(k=k + 1 if k < 32 else k - 1)),
        ("cycle-after-finish", lambda h, cs, s: cs.append(copy.deepcopy(cs[-1]) | {"cycle": len(cs)})),
    ]
    faults = base.header.get("faults") or {}
    # A cache fault shows in a cycle whose caches end elsewhere than committed length - 1.
    ends = [c["committed_len_before"] + len(c["committed_token_ids"]) - 1 for c in cycles]
    target_off = any(c["target_cache_len"]["after_rollback"] != e for c, e in zip(cycles, ends))
    draft_off = any(c["draft_cache_len"]["after_rollback"] != e for c, e in zip(cycles, ends))
    if target_off or draft_off:
        edits.append(("faults-removed", lambda h, cs, s: h.pop("faults")))
    if not faults and any(c["target_cache_len"]["after_append"] != e for c, e in zip(cycles, ends)):
        edits.append(("faults-claimed", lambda h, cs, s: h.update(faults={"keep_rejected_kv": True})))
    return [Case(f"inconsistent-{name}", "inconsistent", INVALID, dump(mutated(base, edit))) for name, edit in edits]


def t_text(cycles: list[dict], token: int) -> str:
    """The text a trace already uses for a token id, so only the intended rule is broken."""
    for c in cycles:
        for row in c["target_top"] + c["draft_top"]:
            for e in row:
                if e["token_id"] == token:
                    return e["text"]
    return f"<{token}>"


# ---------------------------------------------------------------- invalid: drafters other than a draft model

def drafter_kind(base: Base) -> str:
    return (base.header.get("drafter") or {}).get("kind", "model")


def drafter_cases(base: Base) -> list[Case]:
    """Edits that only a prompt-lookup or other-tokenizer trace can carry, each breaking one of its rules."""
    kind, cycles = drafter_kind(base), base.cycles
    proposing = [i for i, c in enumerate(cycles) if c["draft_token_ids"]]
    ci = proposing[len(proposing) // 2]
    edits = [
        ("claims-draft-model", lambda h, cs, s: h["drafter"].update(kind="model")),
        ("drafter-unknown", lambda h, cs, s: h["drafter"].update(kind="eagle")),
        ("drafter-not-object", lambda h, cs, s: h.update(drafter="prompt-lookup")),
        ("state-dropped", lambda h, cs, s: cs[ci].pop("drafter_state")),
        ("state-other-kind", lambda h, cs, s: cs[ci]["drafter_state"].update(kind="model")),
        ("draft-cache-claimed", lambda h, cs, s: cs[ci].update(draft_cache_len=dict(cs[ci]["target_cache_len"]))),
        ("p_draft-not-one-hot", lambda h, cs, s: (cs[ci]["p_draft"].__setitem__(0, 0.5), cs[ci]["draft_top"][0][0].update(p=0.5),
                                                   cs[ci]["accept_prob"].__setitem__(0, min(1.0, cs[ci]["p_target"][0] / 0.5)))),
        ("draft_top-second-entry", lambda h, cs, s: cs[ci]["draft_top"][0].append(
            {"token_id": other_token(base, cs[ci]["draft_token_ids"][0]), "text": "?", "p": 0.0001})),
        ("beta-not-p_target", lambda h, cs, s: cs[ci]["beta"].__setitem__(
            0, cs[ci]["p_target"][0] + (0.25 if cs[ci]["p_target"][0] < 0.5 else -0.25))),
    ]
    if kind == "prompt-lookup":
        edits += [
            ("match-moved", lambda h, cs, s: cs[ci]["drafter_state"].update(
                match_start=cs[ci]["drafter_state"]["match_start"] + 1,
                continuation_start=cs[ci]["drafter_state"]["continuation_start"] + 1)),
            ("ngram-too-long", lambda h, cs, s: h["drafter"].update(max_ngram=17)),
            ("ngram-outside-settings", lambda h, cs, s: h["drafter"].update(
                min_ngram=cs[ci]["drafter_state"]["ngram_size"] + 1, max_ngram=16)),
            ("unmatched-but-proposes", lambda h, cs, s: cs[ci]["drafter_state"].update(matched=False)),
            ("proposed-miscounted", lambda h, cs, s: cs[ci]["drafter_state"].update(proposed=len(cs[ci]["draft_token_ids"]) + 1)),
        ]
    if kind == "other-tokenizer":
        own = cycles[ci]["drafter_state"]["draft_token_ids"]
        edits += [
            ("sampled-temperature", lambda h, cs, s: h["settings"].update(temperature=1.0)),
            ("draft-steps-retyped", lambda h, cs, s: h["drafter"].update(max_draft_steps="many")),
            ("reencoding-differs", lambda h, cs, s: cs[ci]["drafter_state"]["target_token_ids"].__setitem__(
                0, other_token(base, cs[ci]["drafter_state"]["target_token_ids"][0]))),
            ("own-cache-before+1", lambda h, cs, s: cs[ci]["drafter_state"]["draft_cache_len"].update(
                before=cs[ci]["drafter_state"]["draft_cache_len"]["before"] + 1)),
            ("own-cache-rollback+1", lambda h, cs, s: cs[ci]["drafter_state"]["draft_cache_len"].update(
                after_rollback=cs[ci]["drafter_state"]["draft_cache_len"]["after_rollback"] + 1)),
            ("own-id-out-of-vocab", lambda h, cs, s: cs[ci]["drafter_state"]["draft_token_ids"].__setitem__(
                0, h["drafter"]["draft_vocab_size"])),
        ]
        if any(own[0] in c["drafter_state"]["draft_token_ids"] for i, c in enumerate(cycles) if i != ci):
            edits.append(("own-text-changed-once", lambda h, cs, s: cs[ci]["drafter_state"]["draft_token_texts"].__setitem__(
                0, cs[ci]["drafter_state"]["draft_token_texts"][0] + "#")))
    edits += [
        ("summary-rate", moved_acceptance_rate),
        ("summary-per-position", moved_first_position_rate),
        ("more-than-k", lambda h, cs, s: h["settings"].update(k=max(1, len(cs[ci]["draft_token_ids"]) - 1))),
    ]
    return [Case(f"drafter-{name}", "inconsistent", INVALID, dump(mutated(base, edit))) for name, edit in edits]


def eagle_cases(base: Base) -> list[Case]:
    """Edits that break an EAGLE head's own rules: K proposals, its cache kept over the target's
    positions (only entries built on true features survive), and which feature each step read."""
    k, cycles = base.k, base.cycles
    partial = [i for i, c in enumerate(cycles) if 0 < c["num_accepted"] < k]
    ci = partial[0] if partial else 0
    edits = [
        ("feature-sources-all-target", lambda h, cs, s: cs[ci]["drafter_state"].update(feature_sources=["target"] * k)),
        ("feature-sources-short", lambda h, cs, s: cs[ci]["drafter_state"]["feature_sources"].pop()),
        ("first-feature-moved", lambda h, cs, s: cs[ci]["drafter_state"].update(
            first_feature_position=cs[ci]["drafter_state"]["first_feature_position"] + 1)),
        ("state-other-kind", lambda h, cs, s: cs[ci]["drafter_state"].update(kind="prompt-lookup")),
        ("cache-null", lambda h, cs, s: cs[ci].update(draft_cache_len=None)),
        ("fewer-than-k", lambda h, cs, s: [cs[ci][f].pop() for f in ("draft_token_ids", "draft_token_texts")]),
    ]
    if partial:  # a draft model would keep the accepted entries and need no catch-up after a rejection
        edits.append(("claims-draft-model", lambda h, cs, s: h["drafter"].update(kind="model")))
    return [Case(f"eagle-{name}", "inconsistent", INVALID, dump(mutated(base, edit))) for name, edit in edits]


# ---------------------------------------------------------------- invalid: huge and deep

def huge_and_deep_cases(base: Base) -> list[Case]:
    text = dump(base.records())
    first, rest = text.split(b"\n", 1)
    out = [Case("over-size-limit", "huge", INVALID, text, max_bytes=len(text) - 1),
           Case("huge-string", "huge", INVALID, first[:-1] + b', "blob": "' + b"x" * 3_000_000 + b'"}\n' + rest,
                max_bytes=2_000_000)]
    for depth in (17, 1000, 100_000):
        deep = b"[" * depth + b"]" * depth
        out.append(Case(f"deep-{depth}", "deep", INVALID, first[:-1] + b', "deep": ' + deep + b"}\n" + rest))
        out.append(Case(f"deep-line-{depth}", "deep", INVALID, text + b"{" * depth + b"\n"))
    return out


# ---------------------------------------------------------------- all cases

def generate(bases: list[Base], seed: int = 0, retypes_per_base: int = 6) -> list[Case]:
    """Every family of cases on the first bases; on the later ones, half of the out-of-range edits
    (the same edits on another real trace) to keep the test run short."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for i, base in enumerate(bases):
        if drafter_kind(base) == "eagle":  # K proposals and a cache, like a draft model, plus its own rules
            made = valid_cases(base, rng) + partial_cases(base) + inconsistent_cases(base, rng) + eagle_cases(base)
            for c in made:
                c.name = f"{base.name}/{c.name}"
            cases += made
            continue
        if drafter_kind(base) != "model":  # no draft cache over the target's positions: their own families
            made = valid_cases(base, rng) + partial_cases(base) + drafter_cases(base)
            for c in made:
                c.name = f"{base.name}/{c.name}"
            cases += made
            continue
        ranges = range_cases(base, rng)
        made = (valid_cases(base, rng) + partial_cases(base) + retype_cases(base, rng, retypes_per_base)
                + (ranges if i < 4 else ranges[::2]) + inconsistent_cases(base, rng)
                + (structure_cases(base) + number_cases(base) + huge_and_deep_cases(base) if i < 3 else []))
        for c in made:
            c.name = f"{base.name}/{c.name}"
        cases += made
    return cases
