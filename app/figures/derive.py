"""Plain data derived from a trace once, shared by the figures and the pages.

No Streamlit and no Plotly here: the pages cache these results per trace, and the
figure functions and tests use them directly.
"""
from dataclasses import dataclass

from engine.trace import Trace
from engine.trace.schema import (
    DRAFT_MODEL,
    EAGLE,
    EAGLE3,
    NEXT_BONUS,
    OTHER_TOKENIZER,
    PROMPT_LOOKUP,
    ROOT,
    SUFFIX,
    SUFFIX_REQUEST,
)

# Where a token of the text came from.
PROMPT, ACCEPTED, RESAMPLED, BONUS = "prompt", "accepted", "resampled", "bonus"
# What happened to one drafted position in the left-to-right test.
REJECTED, DISCARDED = "rejected", "discarded"

# Shown instead of invisible characters, so a reader can see spaces and line ends.
VISIBLE_WHITESPACE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}
TEXT_WRAP = 72  # characters per line in the text view (a monospace grid)


@dataclass(frozen=True)
class TokenInfo:
    """One token of the text, with the numbers its hover shows."""

    text: str  # as decoded; never HTML-escaped here
    origin: str  # PROMPT, ACCEPTED, RESAMPLED or BONUS
    cycle: int | None  # None for prompt tokens
    p_target: float | None = None
    p_draft: float | None = None
    accept_prob: float | None = None
    u: float | None = None
    residual: float | None = None  # normalised residual probability of a resampled token
    row: int = 0  # line in the text view
    col: int = 0  # first column in the text view
    width: int = 1  # columns the visible text takes
    depth: int | None = None  # a tree cycle's token: its depth in the draft tree (None in a chain cycle)


def visible_text(text: str) -> str:
    """The token with whitespace and control characters made visible (not escaped)."""
    out = []
    for ch in text:
        if ch in VISIBLE_WHITESPACE:
            out.append(VISIBLE_WHITESPACE[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
    return "".join(out) or "∅"  # an empty decode still needs a visible cell


def quoted(text: str) -> str:
    """A token in running text: its visible text between curly quotes, which no decoded token
    confuses with its own (a token such as 's between straight quotes would read ''s')."""
    return f"“{visible_text(text)}”"


def whitespace_legend() -> str:
    """What the marks visible_text puts in place of whitespace mean, in one line of plain text."""
    names = {" ": "space", "\n": "newline", "\t": "tab"}  # a carriage return is rare: its mark is not named
    return ", ".join(f"{VISIBLE_WHITESPACE[ch]} {name}" for ch, name in names.items())


def prob_text(p: float) -> str:
    """A probability as every page prints it, with its leading digits visible at any size: three
    decimals from 0.01, four below, and a mantissa and power of ten under 0.001, so a value such
    as 0.0004 never reads as 0.000 beside a comparison that needs it. At most six characters."""
    if p == 0:
        return "0"
    if p >= 0.01:
        return f"{p:.3f}"
    if p >= 0.001:
        return f"{p:.4f}"
    mantissa, exponent = f"{p:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _lookup(entries: list[dict] | None, token_id: int, field: str) -> float | None:
    """A probability of token_id from a list of top entries, None if it was not kept."""
    for entry in entries or []:
        if entry["token_id"] == token_id:
            return entry[field]
    return None


def is_tree_cycle(c: dict) -> bool:
    """A tree cycle record carries a `tree` entry instead of the per-position fields."""
    return isinstance(c.get("tree"), dict)


def tree_cycle_tokens(c: dict) -> list[TokenInfo]:
    """The tokens a tree cycle committed: the accepted path's nodes (p_target = the node's p, p_draft its q,
    accept_prob the residual probability r[t] it was tried with), then the bonus or residual token."""
    tree = c["tree"]
    nodes, path = tree["nodes"], tree["path"]
    tried = {t["node"]: t for t in tree["tried"]}
    last = path[-1] if path else ROOT
    tokens = []
    for i, text in enumerate(c["committed_token_texts"]):
        if i < len(path):
            node, t = nodes[path[i]], tried.get(path[i], {})
            tokens.append(TokenInfo(text, ACCEPTED, c["cycle"], node["p"], node["q"], t.get("p_residual"), t.get("u"),
                                    depth=node["depth"]))
        elif tree["next_token_kind"] == NEXT_BONUS:
            row = tree["target_top"][last + 1] if last + 1 < len(tree["target_top"]) else []
            tokens.append(TokenInfo(text, BONUS, c["cycle"], _lookup(row, tree["next_token_id"], "p"), depth=len(path) + 1))
        else:
            res = tree.get("residual_top")
            tokens.append(TokenInfo(text, RESAMPLED, c["cycle"], _lookup(res, tree["next_token_id"], "p_target"),
                                    residual=_lookup(res, tree["next_token_id"], "residual"), depth=len(path) + 1))
    return tokens


def cycle_tokens(c: dict) -> list[TokenInfo]:
    """The tokens cycle c committed, in order, with the numbers behind each."""
    if is_tree_cycle(c):
        return tree_cycle_tokens(c)
    tokens = []
    n_acc = c["num_accepted"]
    for i, (tid, text) in enumerate(zip(c["committed_token_ids"], c["committed_token_texts"])):
        if i < n_acc:
            tokens.append(TokenInfo(text, ACCEPTED, c["cycle"], c["p_target"][i], c["p_draft"][i],
                                    c["accept_prob"][i], c["u"][i] if i < len(c["u"]) else None))  # greedy vLLM: no u
        elif c["rejected_position"] is not None:
            res = c["residual_top"]
            tokens.append(TokenInfo(text, RESAMPLED, c["cycle"], _lookup(res, tid, "p_target"),
                                    _lookup(res, tid, "p_draft"), residual=_lookup(res, tid, "residual")))
        else:  # the bonus token, drawn from the target's distribution at position K+1
            tokens.append(TokenInfo(text, BONUS, c["cycle"], _lookup(c["target_top"][-1], tid, "p")))
    return tokens


def place_tokens(tokens: list[TokenInfo], wrap: int = TEXT_WRAP) -> list[TokenInfo]:
    """Lay tokens out on a monospace grid: wrap at `wrap` columns, break after newlines."""
    placed, row, col = [], 0, 0
    for tok in tokens:
        width = min(len(visible_text(tok.text)), wrap)
        if col + width > wrap and col > 0:
            row, col = row + 1, 0
        placed.append(TokenInfo(**{**tok.__dict__, "row": row, "col": col, "width": width}))
        col += width
        if "\n" in tok.text:
            row, col = row + 1, 0
    return placed


def token_table(trace: Trace, wrap: int = TEXT_WRAP) -> list[TokenInfo]:
    """Prompt and every committed token of the trace, placed for the text view."""
    tokens = [TokenInfo(t, PROMPT, None) for t in trace.header["prompt_token_texts"]]
    for c in trace.cycles:
        tokens.extend(cycle_tokens(c))
    return place_tokens(tokens, wrap)


def tokens_through(trace: Trace) -> list[int]:
    """ends[c] = how many tokens of token_table(trace) exist once cycle c has committed."""
    ends, n = [], len(trace.header["prompt_token_texts"])
    for c in trace.cycles:
        n += len(c["committed_token_ids"])
        ends.append(n)
    return ends


def proposals(c: dict) -> int:
    """Draft tokens this cycle proposed: K for a draft model, 0..K for prompt lookup and the
    other-tokenizer draft; a tree cycle's nodes."""
    return len(c["tree"]["nodes"]) if is_tree_cycle(c) else len(c["draft_token_ids"])


def position_outcomes(c: dict, k: int) -> list[str]:
    """Outcome of each drafted position 1..K: accepted, rejected or discarded."""
    n_acc = c["num_accepted"]
    return [ACCEPTED if i < n_acc else REJECTED if i == n_acc else DISCARDED for i in range(k)]


@dataclass(frozen=True)
class Overview:
    """One marker per (cycle, position) for the all-cycles grid, grouped by outcome."""

    k: int
    points: dict[str, tuple[list[int], list[int]]]  # outcome -> (cycles, positions 1..K+1)


def overview(trace: Trace) -> Overview:
    points: dict[str, tuple[list[int], list[int]]] = {
        ACCEPTED: ([], []), REJECTED: ([], []), DISCARDED: ([], []), BONUS: ([], [])}
    for c in trace.cycles:
        if is_tree_cycle(c):
            _tree_points(c, points)
            continue
        proposed = proposals(c)  # K for a draft model; prompt lookup may propose fewer
        for pos, outcome in enumerate(position_outcomes(c, proposed), start=1):
            points[outcome][0].append(c["cycle"])
            points[outcome][1].append(pos)
        if c["bonus_token_id"] is not None:
            points[BONUS][0].append(c["cycle"])
            points[BONUS][1].append(proposed + 1)
    return Overview(trace.k, points)


def _tree_points(c: dict, points: dict[str, tuple[list[int], list[int]]]) -> None:
    """A tree cycle in the all-cycles grid: its path by depth (accepted), then at the next depth the
    bonus, or a rejection when every candidate there was rejected (the residual token)."""
    path = c["tree"]["path"]
    for depth in range(1, len(path) + 1):
        points[ACCEPTED][0].append(c["cycle"])
        points[ACCEPTED][1].append(depth)
    outcome = BONUS if c["tree"]["next_token_kind"] == NEXT_BONUS else REJECTED
    points[outcome][0].append(c["cycle"])
    points[outcome][1].append(len(path) + 1)


def committed_texts(trace, c: dict) -> list[str]:
    """The committed sequence's token texts when cycle c starts (prompt and every earlier cycle's tokens)."""
    texts = list(trace.header["prompt_token_texts"])
    for earlier in trace.cycles[: c["cycle"]]:
        texts += earlier["committed_token_texts"]
    return texts


def sequence_texts(trace, c: dict, compacted: bool = False) -> list[str]:
    """Token text at each cache slot when cycle c starts: prompt and committed tokens so far,
    then this cycle's drafts (a KV-cache cell shows whose K/V it holds with it). A tree cycle's
    node i sits in slot L+1+i; `compacted`: after its compaction the path's tokens sit right after
    the root, and the slots past them still hold the nodes' old K/V."""
    texts = committed_texts(trace, c)
    if not is_tree_cycle(c):
        return texts + list(c["draft_token_texts"])
    nodes = [n["text"] for n in c["tree"]["nodes"]]
    if not compacted:
        return texts + nodes
    held = max(0, c["target_cache_len"]["after_rollback"] - len(texts))  # path nodes kept in the cache
    return texts + list(c["committed_token_texts"][:held]) + nodes[held:]



@dataclass(frozen=True)
class OwnPrompt:
    """The prompt as a draft model read it when that was not the target's rendering (draft_prompt "raw",
    docs/drafters.md "A draft model mis-set on purpose"): the draft's cache holds these tokens, then every token
    committed after the target's prompt, so each of its positions is `offset` off the target's."""

    token_ids: tuple[int, ...]
    texts: tuple[str | None, ...]  # each token's text where the trace writes that id out elsewhere, else None
    target_len: int  # the target's prompt length (with the chat template)

    @property
    def offset(self) -> int:
        """Positions the draft's cache holds beyond the target's (negative: fewer)."""
        return len(self.token_ids) - self.target_len

    def label(self, i: int) -> str:
        """Token i of the draft's prompt as a cell shows it: its text, or its id when the trace has no text for it."""
        text = self.texts[i]
        return f"#{self.token_ids[i]}" if text is None else text

    def cache_texts(self, sequence_texts: list[str]) -> list[str]:
        """Token text at each of the draft's cache positions, from the target's `sequence_texts`: its own
        prompt, then the committed tokens after the target's prompt and this cycle's drafts."""
        return [self.label(i) for i in range(len(self.token_ids))] + list(sequence_texts[self.target_len:])


def own_prompt(trace) -> OwnPrompt | None:
    """The draft's own prompt when it read another rendering than the target (header drafter entry
    draft_prompt_token_ids), else None (its cache lines up with the target's).

    The header has no texts for those ids, and the format gains none: a draft model shares the target's
    tokenizer, and the loader checks that an id is written with one text everywhere in a trace, so a token
    takes the text the trace gives its id elsewhere (the target's prompt, a committed or drafted token, a
    top-N entry); an id the trace never writes out stays an id."""
    header = trace.header
    ids = (header.get("drafter") or {}).get("draft_prompt_token_ids")
    if ids is None or list(ids) == list(header["prompt_token_ids"]):
        return None
    wanted = set(ids)
    known = {t: x for t, x in zip(header["prompt_token_ids"], header["prompt_token_texts"]) if t in wanted}
    for c in trace.cycles:
        if wanted <= known.keys():
            break
        pairs = list(zip(c["committed_token_ids"], c["committed_token_texts"]))
        if not is_tree_cycle(c):  # (the tree refuses a draft reading its own prompt: chains only)
            pairs += zip(c["draft_token_ids"], c["draft_token_texts"])
            pairs += [(e["token_id"], e["text"]) for rows in (c["target_top"], c["draft_top"]) for row in rows for e in row]
        known.update((t, x) for t, x in pairs if t in wanted and t not in known)
    return OwnPrompt(tuple(ids), tuple(known.get(t) for t in ids), len(header["prompt_token_ids"]))


# ---------------------------------------------------------------- where a proposal came from

# Roles of a token in the prompt-lookup view.
LOOKUP_PLAIN, LOOKUP_NGRAM, LOOKUP_COPIED, LOOKUP_TAIL = "plain", "matched n-gram", "copied as proposal", "last tokens"
LOOKUP_CONTEXT = 24  # tokens shown before the match


def lookup_view(texts: list[str], c: dict) -> list[tuple[str, str]] | None:
    """(token text, role) over the committed sequence before a prompt-lookup cycle: the earlier
    n-gram that matched, the tokens copied after it, and the last n tokens that were looked up.
    None when the cycle is not a prompt-lookup cycle with a match. `texts` holds the token
    texts of the committed sequence (prompt and output) up to this cycle."""
    state = c.get("drafter_state") or {}
    if state.get("kind") != PROMPT_LOOKUP or not state.get("matched"):
        return None
    n, start, copied = state["ngram_size"], state["match_start"], len(c["draft_token_ids"])
    end = len(texts)
    roles = [LOOKUP_PLAIN] * end
    for p in range(end - n, end):
        roles[p] = LOOKUP_TAIL
    for p in range(start, start + n):
        roles[p] = LOOKUP_NGRAM
    for p in range(start + n, min(start + n + copied, end)):
        roles[p] = LOOKUP_COPIED
    first = max(0, start - LOOKUP_CONTEXT)
    return list(zip(texts[first:end], roles[first:end]))


# Roles of a token in the suffix-decoding view (the tail is the lookup's: the last tokens, matched).
SUFFIX_MATCH, SUFFIX_FOLLOWED = "matched suffix (earlier)", "what followed it there (proposed)"


def suffix_view(texts: list[str], c: dict) -> list[tuple[str, str]] | None:
    """(token text, role) over the committed sequence before a suffix-decoding cycle that proposed: the
    last match_len tokens that matched and, when this request's own tree proposed, an earlier place where
    they stand followed by the proposal. None for any other cycle. `texts` as for lookup_view."""
    state = c.get("drafter_state") or {}
    if state.get("kind") != SUFFIX or not state.get("proposed"):
        return None
    m, n, end = state["match_len"], state["proposed"], len(texts)
    roles = [LOOKUP_PLAIN] * end
    start = state.get("match_start") if state.get("source") == SUFFIX_REQUEST else None
    if start is not None:
        for p in range(start, start + m):
            roles[p] = SUFFIX_MATCH
        for p in range(start + m, min(start + m + n, end)):
            roles[p] = SUFFIX_FOLLOWED
    for p in range(end - m, end):  # last: the tail is what this cycle looked up
        roles[p] = LOOKUP_TAIL
    first = max(0, (end - m if start is None else start) - LOOKUP_CONTEXT)
    return list(zip(texts[first:end], roles[first:end]))


@dataclass(frozen=True)
class DraftTokenRow:
    """One draft token of the other-tokenizer drafter and the target tokens its text became."""

    draft_token_id: int
    draft_text: str
    target_texts: list[str]  # the target tokens covering this draft token's text (within K)
    aligned: bool | None  # does its end fall on a target token boundary? None if not recorded


def alignment_rows(c: dict) -> list[DraftTokenRow] | None:
    """Draft tokens vs the target's re-encoding, for an other-tokenizer cycle; else None."""
    state = c.get("drafter_state") or {}
    if state.get("kind") != OTHER_TOKENIZER:
        return None
    ends = state["draft_token_target_ends"]
    aligned = state.get("draft_token_boundary_aligned") or [None] * len(ends)
    target_texts = state["target_token_texts"]
    rows, start = [], 0
    for tid, text, end, ok in zip(state["draft_token_ids"], state["draft_token_texts"], ends, aligned):
        rows.append(DraftTokenRow(tid, text, target_texts[start:end], ok))
        start = end
    return rows


# ---------------------------------------------------------------- the EAGLE head

HEAD_ROW = "EAGLE head"  # what the KV strip and the captions call the head's own cache
HEAD3_ROW = "EAGLE-3 head"  # the same for an EAGLE-3 head
FEATURE_TARGET, FEATURE_HEAD = "target", "head"  # drafter_state.feature_sources values


def cycle_drafter(c: dict, drafter: str | None = None) -> str:
    """The drafter of a cycle: the trace header's kind when the caller knows it, else the cycle's
    own drafter_state kind (prompt lookup, other tokenizer, suffix, eagle), else a draft model."""
    if drafter:
        return drafter
    state = c.get("drafter_state") or {}
    return state.get("kind") or (EAGLE if "feature_sources" in state else DRAFT_MODEL)


def draft_cache_name(drafter: str) -> str:
    """The row name of the drafter's cache over the target's positions."""
    return {EAGLE: HEAD_ROW, EAGLE3: HEAD3_ROW}.get(drafter, "draft")


@dataclass(frozen=True)
class HeadStep:
    """One draft step of the EAGLE head: what it read and what it proposed."""

    step: int  # 1..K
    position: int  # the sequence position whose head entry this step writes
    token_text: str  # the token it read at that position (the last committed one, then its own drafts)
    feature: str | None  # FEATURE_TARGET, FEATURE_HEAD, or None when the trace does not record it
    feature_position: int  # the position of the feature it read (f at position - 1)
    proposed_text: str  # the draft token it proposed
    outcome: str  # ACCEPTED, REJECTED or DISCARDED


def head_steps(texts: list[str], c: dict) -> list[HeadStep]:
    """The head's draft steps of an eagle cycle. `texts` holds the committed sequence's token texts
    before this cycle. Step 1 reads the last committed token with the target's true feature of the
    token before it (from the last verify pass); step i > 1 reads draft d_{i-1} with the head's
    own predicted feature."""
    n, k = c["committed_len_before"], len(c["draft_token_ids"])
    sources = (c.get("drafter_state") or {}).get("feature_sources")
    if not isinstance(sources, list) or len(sources) != k:
        sources = [None] * k
    fed = [texts[n - 1] if n - 1 < len(texts) else "?"] + list(c["draft_token_texts"][:-1])
    outcomes = position_outcomes(c, k)
    return [HeadStep(i + 1, n - 1 + i, fed[i], sources[i], n - 2 + i, c["draft_token_texts"][i], outcomes[i])
            for i in range(k)]
