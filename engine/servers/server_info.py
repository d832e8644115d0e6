"""What a live server says about itself: its kind, version, model, and the speculative configuration it runs.

Read from /version, /v1/models and /server_info where each answers (a 404 is "not told", never an
error). vLLM's /server_info (open only with VLLM_SERVER_DEV_MODE=1) holds `vllm_config`, a long repr
string with `speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3)`:
the method and K, never the n-gram range, so the user's --speculative-config adds what the server
does not say, and must not contradict what it does. SGLang's /server_info is JSON with
speculative_algorithm and speculative_num_draft_tokens.
"""
import re
from dataclasses import dataclass

from engine.servers.http_client import ClientError, get_json
from engine.servers.server_metrics import short

VLLM, SGLANG, UNKNOWN = "vLLM", "SGLang", "unknown"
KINDS = (VLLM, SGLANG, UNKNOWN)
SPEC_REPR = re.compile(r"speculative_config=SpeculativeConfig\(([^()]*)\)")
REPR_FIELD = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|[\w.+-]+)")
# vLLM's repr names K num_spec_tokens; its --speculative-config (what a user writes) num_speculative_tokens
VLLM_KEYS = {"method": "method", "model": "model", "num_spec_tokens": "num_speculative_tokens"}
SGLANG_KEYS = {"speculative_algorithm": "method", "speculative_num_draft_tokens": "num_draft_tokens",
               "speculative_num_steps": "num_steps", "speculative_eagle_topk": "eagle_topk",
               "speculative_draft_model_path": "model"}
MAX_TEXT = 300  # a version, a model name or path kept from the server


@dataclass(frozen=True)
class ServerInfo:
    kind: str  # KINDS
    version: str | None
    model: str | None  # the name requests must give (/v1/models' id)
    model_root: str | None  # where the server loaded it from
    max_model_len: int | None
    speculative_config: dict | None  # as the server reports it, in --speculative-config's key names


def text_of(value) -> str | None:
    """A name the server gives, kept printable and short (the manifest holds only printable text)."""
    if not isinstance(value, str) or not value.strip():
        return None
    return "".join(c if c.isprintable() else "?" for c in value[:MAX_TEXT])


def repr_value(raw: str):
    """One value of vLLM's repr: a quoted string, None, an int or a bare word."""
    if raw.startswith("'"):
        return raw[1:-1][:MAX_TEXT]
    if raw == "None":
        return None
    return int(raw) if raw.isdigit() else raw[:MAX_TEXT]


def vllm_speculative_config(vllm_config: str) -> dict | None:
    """The speculative config in vLLM's config repr, in --speculative-config's names; None when it has none."""
    found = SPEC_REPR.search(vllm_config)
    if found is None:
        return None
    fields = dict(REPR_FIELD.findall(found.group(1)))
    return {VLLM_KEYS[k]: repr_value(v) for k, v in fields.items() if k in VLLM_KEYS and repr_value(v) is not None}


def sglang_speculative_config(info: dict) -> dict | None:
    if not isinstance(info.get("speculative_algorithm"), str):
        return None
    return {name: info[key] for key, name in SGLANG_KEYS.items()
            if isinstance(info.get(key), (str, int)) and not isinstance(info.get(key), bool)}


def kind_of(models: dict | None, info: dict | None) -> str:
    if isinstance(info, dict) and isinstance(info.get("vllm_config"), str):
        return VLLM
    if isinstance(info, dict) and "speculative_algorithm" in info:  # SGLang's server args, set or None
        return SGLANG
    owner = first_model(models).get("owned_by")
    return {"vllm": VLLM, "sglang": SGLANG}.get(owner if isinstance(owner, str) else "", UNKNOWN)


def first_model(models: dict | None) -> dict:
    data = models.get("data") if isinstance(models, dict) else None
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}


def max_len_of(model: dict) -> int | None:
    n = model.get("max_model_len")
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 2**31 else None


def read_server_info(base: str, timeout_s: float, retries: int) -> ServerInfo:
    """The server's own account of itself; what it does not tell is None."""
    version = get_json(f"{base}/version", timeout_s, retries)
    models = get_json(f"{base}/v1/models", timeout_s, retries)
    try:
        info = get_json(f"{base}/server_info", timeout_s, retries)
    except ClientError:
        info = None  # a server may guard it (vLLM without dev mode answers 404; others may refuse): not told
    model = first_model(models)
    kind = kind_of(models, info)
    spec = None
    if kind == VLLM and isinstance(info, dict):
        spec = vllm_speculative_config(info["vllm_config"])
    elif kind == SGLANG and isinstance(info, dict):
        spec = sglang_speculative_config(info)
    return ServerInfo(kind, text_of((version or {}).get("version")), text_of(model.get("id")),
                      text_of(model.get("root")), max_len_of(model), spec)


def merged_config(told: dict | None, given: dict | None, url: str) -> tuple[dict | None, str | None]:
    """The speculative config to record and where it came from: the server's, plus the user's keys it
    does not report; a key both give must agree (a user who names another K runs another experiment)."""
    if told is None and given is None:
        return None, None
    if given is None:
        return dict(told), "server_info"
    if told is None:
        return dict(given), "user"
    for key, value in told.items():
        if key in given and given[key] != value:
            raise ClientError(f"{url}/server_info: the server runs {key}={short(value)} but --speculative-config "
                              f"says {short(given[key])}: give what the server was started with")
    return given | told, "server_info+user"
