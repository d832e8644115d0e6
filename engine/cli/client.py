"""`python -m engine client --url URL --prompts FILE --out FOLDER`: a workload against a live server.

The prompt file, the settings and --speculative-config are checked before anything is sent; the
run is engine/servers/client.py's, with a progress bar over requests. Any failure (the server down,
an HTTP error, a timeout, an answer without per-request metrics) is one line naming the URL, exit
code 2, and the finished requests stay in FOLDER: the same command with --resume continues.

May import everything in the engine (engine/workload/prompts.py reads the prompt file).
"""
import json
import sys
from pathlib import Path

from engine.config import SettingsError
from engine.servers.server_workload import ENDPOINTS, SETTING_RANGES


def add_client_parser(sub) -> None:
    client = sub.add_parser("client", help="send a prompt file to a live OpenAI-compatible server (vLLM, SGLang) and "
                                           "keep every answer with its speculative-decoding metrics (docs/cli.md)")
    client.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    client.add_argument("--prompts", required=True, metavar="FILE", help="a prompt file, as `run --prompts` reads it")
    client.add_argument("--out", required=True, help="the server workload folder to write")
    client.add_argument("--endpoint", choices=list(ENDPOINTS), default="chat",
                        help="chat (/v1/chat/completions, the default) or completions (/v1/completions, prompts only)")
    client.add_argument("--model", default=None, help="the model name to send (default: the first of /v1/models)")
    client.add_argument("--max-tokens", type=int, default=64)
    client.add_argument("--temperature", type=float, default=0.0)
    client.add_argument("--top-p", type=float, default=1.0)
    client.add_argument("--seed", type=int, default=0, help="request i is sent with seed * 100000 + i")
    client.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    client.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one answer")
    client.add_argument("--retries", type=int, default=2,
                        help="tries again after a connection error, a timeout or a 5xx answer (never a 4xx)")
    client.add_argument("--speculative-config", default=None, metavar="JSON",
                        help="what the server was started with, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 3, "
                             "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}': a server reports its method and K "
                             "at most, never an n-gram range")
    client.add_argument("--resume", action="store_true", help="continue the workload in --out: send only what is not done")


def checked_settings(args):
    from engine.servers.client import ClientSettings

    if not args.url.startswith(("http://", "https://")):
        raise SettingsError(f"--url {args.url}: give the server's address as http://HOST:PORT")
    s = ClientSettings(args.url, args.endpoint, args.max_tokens, args.temperature, args.top_p, args.seed,
                       args.concurrency, args.timeout, args.retries, args.model)
    for key, value in s.manifest_settings().items():
        low, high = SETTING_RANGES[key]
        if not low <= value <= high or key == "timeout_s" and value == 0:
            flag = {"timeout_s": "timeout"}.get(key, key).replace("_", "-")
            raise SettingsError(f"--{flag} {value}: it must lie between {low} and {high}"
                                + (" (and above 0)" if key == "timeout_s" else ""))
    return s


def speculative_config(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        config = json.loads(text)
    except ValueError as err:
        raise SettingsError(f"--speculative-config: not JSON ({err})") from None
    if not isinstance(config, dict) or not config:
        raise SettingsError("--speculative-config: give a JSON object, as vLLM's --speculative-config takes")
    return config


def check_out(out: str) -> None:
    if Path(out).exists() and not Path(out).is_dir():
        raise SettingsError(f"--out {out}: names a file; a server workload is a folder")


def finished_before(args) -> int:
    """Requests a resumed folder already holds (the bar starts there)."""
    from engine.servers.server_workload import DONE, MANIFEST, ServerWorkloadError, read_manifest

    if not args.resume or not (Path(args.out) / MANIFEST).is_file():
        return 0
    try:
        return sum(e["status"] == DONE for e in read_manifest(Path(args.out))["requests"])
    except ServerWorkloadError:
        return 0  # run_client refuses it with the reason


def cmd_client(args) -> int:
    from tqdm import tqdm

    from engine.servers.client import run_client
    from engine.servers.server_workload import DONE, open_server_workload
    from engine.workload.prompts import read_prompts
    from engine.workload.server_report import format_server_workload_stats
    from engine.workload.server_stats import server_workload_stats

    s = checked_settings(args)
    config = speculative_config(args.speculative_config)
    check_out(args.out)
    requests = read_prompts(args.prompts)
    bar = tqdm(total=len(requests), initial=finished_before(args), unit="req", desc="requests", file=sys.stderr)

    def on_request(entry: dict) -> None:
        if entry["status"] == DONE:
            bar.update(1)
        bar.set_postfix(request=entry["id"], status=entry["status"])

    try:
        run_client(requests, s, args.out, prompts_name=Path(args.prompts).name, speculative_config=config,
                   resume=args.resume, on_request=on_request)
    finally:
        bar.close()
    print(format_server_workload_stats(server_workload_stats(open_server_workload(args.out))))
    print(f"server workload written to {args.out}: {len(requests)} requests done")
    return 0
