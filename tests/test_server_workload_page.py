"""The Workload page on a server workload (`python -m engine client`'s folder under the live runs' folder's
servers/): live, a folder the real client wrote against the real vLLM (tests/live_vllm.py) is shown with
engine/workload/server_stats.py's numbers (the headline, each request's row and strip, the histogram,
the categories, both totals and their verdict), and `engine stats FOLDER` prints the same strip and
verdict. Without vLLM: the figures are plain functions, a folder that is refused is one escaped line,
a folder's texts are escaped, and only plain folders under servers/ are listed."""
import base64
import html
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from app.figures.server_workload import accepted_strip_figure, prompt_length_figure
from app.figures.style import validated
from app.figures.workload import bin_name, fmt
from engine.cli import main
from engine.servers.server_workload import open_server_workload
from engine.workload.server_report import COUNT_NAMES, count_text, step_text
from engine.workload.server_stats import server_workload_stats
from tests.replica_sample import open_workload_page, server_folder
from tests.server_workload_sample import PROMPTS, write_server_workload


def texts(at) -> str:
    """What the page says, md()'s escapes taken out."""
    parts = [m.value for m in [*at.markdown, *at.caption]]
    return html.unescape("\n".join(parts).replace("\\", ""))


def figure(at, key: str) -> dict:
    shown = [e for e in at.get("plotly_chart") if e.proto.id.endswith(f"-{key}")]
    assert len(shown) == 1, f"figure {key} not shown"
    return json.loads(shown[0].proto.spec)


def array(a) -> np.ndarray:
    """A Plotly JSON array: a list, or typed bytes (with a shape where it has two dimensions)."""
    if isinstance(a, dict):
        flat = np.frombuffer(base64.b64decode(a["bdata"]), dtype=a["dtype"])
        return flat.reshape([int(n) for n in str(a["shape"]).split(",")]) if "shape" in a else flat
    return np.array(a, dtype=float)


def table(at, first_header: str) -> list[dict]:
    """The Markdown table whose first column is `first_header`, as rows of unescaped cells."""
    for m in at.markdown:
        lines = html.unescape(m.value.replace("\\", "")).splitlines()
        cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
        if cells and cells[0][0] == first_header:
            return [dict(zip(cells[0], row)) for row in cells[2:]]
    raise AssertionError(f"no table headed {first_header!r}")


def strips(stats: dict) -> list[list[float]]:
    return [r["accepted_per_cycle"] for r in stats["per_request"] if r["accepted_per_cycle"] is not None]


def same_strips(z: np.ndarray, expected: list[list[int]]) -> bool:
    rows = [[v for v in row if not math.isnan(v)] for row in np.asarray(z, dtype=float)]
    return rows == [[float(a) for a in steps] for steps in expected]


# ---------------------------------------------------------------- live: the real client against the real vLLM


@pytest.fixture(scope="module")
def live_root(ngram_server, tmp_path_factory, example_traces) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("server-page")
    folder = write_server_workload(ngram_server, root / "runs" / "servers" / "vllm-ngram-k3")
    (root / "traces").mkdir()
    (root / "traces" / "default.jsonl").write_bytes(Path(example_traces["sampled"]).read_bytes())
    return root, folder


def test_the_page_shows_the_engines_numbers_for_a_folder_the_client_wrote(live_root, monkeypatch):
    root, folder = live_root
    stats = server_workload_stats(open_server_workload(folder))
    assert stats["requests"] == len(PROMPTS) and strips(stats)  # greedy n-gram requests that drafted
    at = open_workload_page(root, monkeypatch)
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox[0].value == ("server", folder.name)
    said = texts(at)
    o = stats["overall"]
    assert (f"Across **{stats['requests']}** requests the server accepted **{fmt(o['acceptance_rate'])}** of its draft "
            f"tokens; **{fmt(o['mean_acceptance_length'], 2)}** tokens per step") in said
    # Both totals, side by side: on this quiet server the counters' difference is the requests' sum.
    t = stats["totals"]
    assert t["equal"] is True and t["counters"] == t["requests"]
    assert "**Both totals: equal**" in said
    shown = {row["count"]: row for row in table(at, "count")}
    for key, name in COUNT_NAMES.items():
        assert shown[name]["sum of the requests"] == count_text(t["requests"][key])
        assert shown[name]["the server's counters (after - before)"] == count_text(t["counters"][key])
    # Each request's row: the engine's rate, length and accepted counts step by step.
    rows = {row["request"]: row for row in table(at, "request")}
    assert list(rows) == [r["id"] for r in stats["per_request"]]
    for r in stats["per_request"]:
        assert rows[r["id"]]["category"] == r["category"]
        assert rows[r["id"]]["steps"] == str(r["cycles"])
        assert rows[r["id"]]["acceptance rate"] == fmt(r["acceptance_rate"])
        assert rows[r["id"]]["mean acceptance length"] == fmt(r["mean_acceptance_length"], 2)
        assert rows[r["id"]]["accepted per step"] == " ".join(map(str, r["accepted_per_cycle"]))
    # The strip per request, the histogram and the categories: the same numbers in the figures.
    strip = figure(at, "wl_folder_strip")["data"][0]
    assert strip["y"] == [r["id"] for r in stats["per_request"] if r["accepted_per_cycle"] is not None]
    assert same_strips(array(strip["z"]), strips(stats))
    bars = figure(at, "wl_folder_histogram")["data"][0]
    assert bars["text"] == [str(c) for c in o["accepted_histogram"]]
    categories = figure(at, "wl_folder_categories")["data"][0]
    expected = [stats["categories"][n]["acceptance_rate"] for n in sorted(stats["categories"])] + [o["acceptance_rate"]]
    assert np.allclose(array(categories["y"]), expected)
    lengths = figure(at, "wl_folder_prompt_length")["data"][0]
    assert np.allclose(array(lengths["y"]), [b["acceptance_rate"] for b in stats["context_length"]])


def test_engine_stats_prints_the_same_strip_and_verdict(live_root, capsys):
    _, folder = live_root
    stats = server_workload_stats(open_server_workload(folder))
    capsys.readouterr()
    assert main(["stats", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "ACCEPTED PER STEP" in out and "  equal: every drafted and accepted token" in out
    section = out.split("ACCEPTED PER STEP")[1].split("\n\n")[0].splitlines()[1:]
    assert [line.split() for line in section] == [[r["id"], *step_text(r["accepted_per_cycle"]).split()]
                                              for r in stats["per_request"]]


# ---------------------------------------------------------------- no vLLM


def root_with(tmp_path: Path, example_traces) -> Path:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "default.jsonl").write_bytes(Path(example_traces["sampled"]).read_bytes())
    return tmp_path


def test_the_figures_are_plain_functions_of_the_statistics(tmp_path):
    stats = server_workload_stats(open_server_workload(server_folder(tmp_path / "s")))
    strip = accepted_strip_figure(stats)
    validated(strip)  # Plotly's own validation passes
    assert list(strip.data[0].y) == ["a"] and same_strips(strip.data[0].z, [[1]])
    assert strip.data[0].zmax == stats["k"] == 3
    lengths = prompt_length_figure(stats)
    validated(lengths)
    assert list(lengths.data[0].x) == [bin_name(stats["context_length"][0])] == ["0-127"]
    assert lengths.data[0].y[0] == pytest.approx(1 / 3)


HOSTILE = "<img src=x onerror=alert(1)> **bold** [link](http://example.com) $x$"


def test_a_refused_folder_is_one_escaped_line(tmp_path, example_traces, monkeypatch):
    root = root_with(tmp_path, example_traces)
    folder = server_folder(root / "runs" / "servers" / "hostile")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["url"] = HOSTILE + "\n# a heading"  # a newline: not printable text, so the folder is refused
    (folder / "manifest.json").write_text(json.dumps(manifest))
    at = open_workload_page(root, monkeypatch)
    (error,) = at.error
    assert "\n" not in error.value and "'url'" in html.unescape(error.value.replace("\\", ""))
    assert "<img" not in error.value and "&lt;img" in error.value  # escaped, never HTML
    assert str(root) not in error.value and "runs/servers/hostile/manifest.json" in error.value.replace("\\", "")
    assert not at.get("plotly_chart") and "Both totals" not in texts(at)


def test_a_folders_texts_are_shown_escaped(tmp_path, example_traces, monkeypatch):
    root = root_with(tmp_path, example_traces)
    folder = server_folder(root / "runs" / "servers" / "odd-texts")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["url"] = HOSTILE  # printable: the folder is read, and the text shown as itself
    (folder / "manifest.json").write_text(json.dumps(manifest))
    at = open_workload_page(root, monkeypatch)
    assert not at.error and not at.exception
    raw = "\n".join(c.value for c in at.caption)
    assert "<img" not in raw and "&lt;img" in raw and "\\*\\*bold\\*\\*" in raw and "\\$x\\$" in raw
    assert HOSTILE in texts(at)


def test_only_plain_server_folders_under_servers_are_listed(tmp_path, example_traces, monkeypatch):
    root = root_with(tmp_path, example_traces)
    servers = root / "runs" / "servers"
    server_folder(servers / "plain")
    server_folder(servers / ".hidden")
    outside = server_folder(tmp_path / "elsewhere")
    os.symlink(outside, servers / "linked")
    (servers / "not-a-server").mkdir()
    (servers / "not-a-server" / "manifest.json").write_text('{"format": "speclab-workload"}')
    at = open_workload_page(root, monkeypatch)
    assert at.selectbox[0].options == ["plain (server workload)"]
