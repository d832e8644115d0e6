"""The prompt file of a workload, read as untrusted input and refused line by line.

JSON Lines, one request a line: `{"prompt": "..."}` or `{"messages": [{"role", "content"}, ...]}`,
with optional "id" and "category". A file not named .jsonl or .json whose first non-blank line
does not start with "{" is plain text: one prompt a line. Blank lines are skipped in both. Every refusal names the file,
the line and the field, in one line (PromptFileError, a SettingsError: exit code 2).
"""
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from engine.config import EMPTY_PROMPT, SettingsError
from engine.workload.requests import UNCATEGORISED

# The bundled prompt set: real requests in categories (the diagnosis, workloads and batch sweeps read it).
BUNDLED_PROMPT_SET = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "categories.jsonl"
MAX_REQUESTS = 2000  # a workload is read and summarised as a whole: keep it to what a page can show
MAX_FILE_BYTES = 32 * 2**20  # 2000 prompts of 16k characters each
MAX_PROMPT_CHARS = 1_000_000  # as `engine run --prompt` (the token limit is checked after tokenizing)
MAX_NAME_CHARS = 100  # ids and categories are shown in tables and links
MAX_MESSAGES = 64
ROLES = ("system", "user", "assistant")
KEYS = ("prompt", "messages", "id", "category")


class PromptFileError(SettingsError):
    """A prompt file that cannot be run: the message names the line and the field."""


@dataclass(frozen=True)
class Request:
    """One line of a prompt file: a prompt, or a conversation whose last turn is the user's."""

    line: int  # 1-based, as editors number lines
    id: str
    category: str
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content), in order

    @property
    def text(self) -> str:
        """What the model reads without a chat template: the prompt, or the turns as "role: content"."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(f"{role}: {content}" for role, content in self.messages)

    def fingerprint(self) -> str:
        """A hash of what the request asks, so `--resume` can tell that the file has not changed."""
        body = json.dumps([self.id, self.category, self.prompt, self.messages], ensure_ascii=False)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def read_prompts(path: str | Path) -> list[Request]:
    """The requests of a prompt file, or PromptFileError for the first thing wrong in it."""
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"--prompts {path}: no such file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise PromptFileError(f"--prompts {path}: {path.stat().st_size:,} bytes; at most {MAX_FILE_BYTES:,} are read")
    return parse_prompts(path.read_bytes(), path.name)


def parse_prompts(data: bytes, source: str) -> list[Request]:
    if len(data) > MAX_FILE_BYTES:
        raise PromptFileError(f"{source}: {len(data):,} bytes; at most {MAX_FILE_BYTES:,} are read")
    lines = data.split(b"\n")
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise PromptFileError(f"{source}: no requests (every line is blank)")
    if len(numbered) > MAX_REQUESTS:
        raise PromptFileError(f"{source}: {len(numbered):,} requests; a workload holds at most {MAX_REQUESTS:,}")
    as_json = source.endswith((".jsonl", ".json")) or numbered[0][1].lstrip().startswith(b"{")
    requests = [(parse_json_line if as_json else parse_text_line)(raw, n, source) for n, raw in numbered]
    check_unique_ids(requests, source)
    return requests


def decode_line(raw: bytes, n: int, source: str) -> str:
    try:
        return raw.decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError as err:
        raise PromptFileError(f"{source} line {n}: not UTF-8 text (byte {err.start})") from None


def parse_text_line(raw: bytes, n: int, source: str) -> Request:
    text = decode_line(raw, n, source)
    return Request(n, f"line-{n}", UNCATEGORISED, prompt=checked_prompt(text, n, source, "prompt"))


def parse_json_line(raw: bytes, n: int, source: str) -> Request:
    where = f"{source} line {n}"
    try:
        entry = json.loads(decode_line(raw, n, source), parse_constant=refuse_constant)
    except json.JSONDecodeError as err:
        raise PromptFileError(f"{where}: malformed JSON ({err.msg} at column {err.colno})") from None
    except ValueError as err:  # refuse_constant
        raise PromptFileError(f"{where}: malformed JSON ({err})") from None
    except RecursionError:
        raise PromptFileError(f"{where}: malformed JSON (nested too deeply)") from None
    if not isinstance(entry, dict):
        raise PromptFileError(f"{where}: a request is a JSON object such as {{\"prompt\": \"...\"}}")
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise PromptFileError(f"{where}: unknown key {unknown[0]!r}; a request has {', '.join(KEYS)}")
    if ("prompt" in entry) == ("messages" in entry):
        raise PromptFileError(f"{where}: give exactly one of \"prompt\" and \"messages\"")
    rid = checked_name(entry.get("id", f"line-{n}"), where, "id")
    category = checked_name(entry.get("category", UNCATEGORISED), where, "category")
    if "prompt" in entry:
        return Request(n, rid, category, prompt=checked_prompt(entry["prompt"], n, source, "prompt"))
    return Request(n, rid, category, messages=checked_messages(entry["messages"], n, source))


def refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def checked_prompt(text, n: int, source: str, field: str) -> str:
    where = f"{source} line {n}: field {field!r}"
    if not isinstance(text, str):
        raise PromptFileError(f"{where}: must be a string, not {type(text).__name__}")
    check_encodable(text, where)
    if not text.strip():
        raise PromptFileError(f"{where}: {EMPTY_PROMPT}")
    if len(text) > MAX_PROMPT_CHARS:
        raise PromptFileError(f"{where}: {len(text):,} characters; at most {MAX_PROMPT_CHARS:,} are read")
    return text


def check_encodable(text: str, where: str) -> None:
    """JSON's \\u escapes can spell a lone surrogate, which is no character: the tokenizer, the trace and the
    manifest all write UTF-8, so such text would otherwise fail only after the models load."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise PromptFileError(f"{where}: holds a lone surrogate (U+{ord(text[err.start]):04X} at character "
                              f"{err.start + 1}), which is not a character and cannot be written as UTF-8") from None


def checked_name(value, where: str, field: str) -> str:
    """An id or category: a short line of printable text (numbers are taken as their text)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise PromptFileError(f"{where}: field {field!r} must be a non-empty string")
    check_encodable(value, f"{where}: field {field!r}")
    if len(value) > MAX_NAME_CHARS or not value.isprintable():
        raise PromptFileError(f"{where}: field {field!r} must be printable text of at most {MAX_NAME_CHARS} characters")
    return value


def checked_messages(messages, n: int, source: str) -> tuple[tuple[str, str], ...]:
    where = f"{source} line {n}: field 'messages'"
    if not isinstance(messages, list) or not 1 <= len(messages) <= MAX_MESSAGES:
        raise PromptFileError(f"{where}: must be a list of 1 to {MAX_MESSAGES} turns")
    turns = []
    for i, turn in enumerate(messages):
        if not isinstance(turn, dict) or set(turn) != {"role", "content"}:
            raise PromptFileError(f"{where}[{i}]: a turn is {{\"role\": ..., \"content\": ...}} and nothing else")
        if turn["role"] not in ROLES:
            raise PromptFileError(f"{where}[{i}].role: one of {', '.join(ROLES)}")
        turns.append((turn["role"], checked_prompt(turn["content"], n, source, f"messages[{i}].content")))
    if turns[-1][0] != "user":
        raise PromptFileError(f"{where}: the last turn must be the user's (the model answers it)")
    if sum(len(c) for _, c in turns) > MAX_PROMPT_CHARS:
        raise PromptFileError(f"{where}: more than {MAX_PROMPT_CHARS:,} characters in all")
    return tuple(turns)


def check_unique_ids(requests: list[Request], source: str) -> None:
    seen: dict[str, int] = {}
    for r in requests:
        if r.id in seen:
            raise PromptFileError(f"{source} line {r.line}: field 'id': {r.id!r} is already the id of line {seen[r.id]}")
        seen[r.id] = r.line
