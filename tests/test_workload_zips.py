"""Workload zips are checked whole when they open: damaged entries, unsafe names, links, duplicates and
budgets are refused in one line naming the zip and the entry (engine/workload/zip_checks.py); a batched
workload's row count must agree across its manifest, batch.jsonl and request traces. Built by hand from
the bundled workloads, with byte patches where zipfile would not write such a zip."""
import io
import json
import stat
import struct
import warnings
import zipfile
from functools import cache
from pathlib import Path

import pytest

from engine.cli import main
from engine.workload import folder as workload_folder
from engine.workload import zip_checks
from engine.workload.folder import open_zip
from engine.workload.manifest import WorkloadError

ROOT = Path(__file__).resolve().parents[1]
SINGLE = ROOT / "assets" / "workloads" / "tiny-shakespeare-greedy-k4.zip"
BATCHED = ROOT / "assets" / "workloads" / "tiny-shakespeare-k4-batch-4-greedy.zip"
VICTIM = "request-0002.jsonl"  # the entry the patches damage


@cache
def members(path: Path = SINGLE) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


def zipped(files: dict, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of these entries in order; a value may be a ZipInfo-and-bytes pair (for a name or mode zipfile
    would not choose)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as z, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Duplicate name": the duplicate is the point
        for name, data in files.items() if isinstance(files, dict) else files:
            z.writestr(name, data)
    return buffer.getvalue()


def central_record(data: bytes, name: str) -> int:
    """Where the central directory's record of `name` starts."""
    at = data.rindex(b"PK\x05\x06")
    at = struct.unpack_from("<I", data, at + 16)[0]  # the directory's offset
    while data[at:at + 4] == b"PK\x01\x02":
        n, m, k = struct.unpack_from("<HHH", data, at + 28)
        if data[at + 46:at + 46 + n] == name.encode():
            return at
        at += 46 + n + m + k
    raise AssertionError(f"no record of {name}")


def local_data(data: bytes, name: str) -> int:
    """Where `name`'s (compressed) bytes start, after its local header."""
    header = struct.unpack_from("<I", data, central_record(data, name) + 42)[0]
    n, m = struct.unpack_from("<HH", data, header + 26)
    return header + 30 + n + m


def patched(data: bytes, at: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def good() -> bytes:
    return zipped(members())


def wrong_crc(d):
    return patched(d, central_record(d, VICTIM) + 16, "<I", zipfile.ZipFile(io.BytesIO(d)).getinfo(VICTIM).CRC ^ 1)


def damaged_deflate(d):
    at = local_data(d, VICTIM) + 200
    return d[:at] + bytes(range(7, 7 + 64)) + d[at + 64:]


def size_too_large(d):
    return patched(d, central_record(d, VICTIM) + 24, "<I", len(members()[VICTIM]) + 10)


def size_too_small(d):
    return patched(d, central_record(d, VICTIM) + 24, "<I", len(members()[VICTIM]) - 10)


def encrypted(d):
    return patched(d, central_record(d, VICTIM) + 8, "<H", 0x1)


def method_99(d):
    return patched(d, central_record(d, VICTIM) + 10, "<H", 99)


def points_at_another_header(d):
    other = struct.unpack_from("<I", d, central_record(d, "request-0001.jsonl") + 42)[0]
    return patched(d, central_record(d, VICTIM) + 42, "<I", other)


def points_into_another_entry(d):
    return patched(d, central_record(d, VICTIM) + 42, "<I", local_data(d, "request-0001.jsonl") + 100)


@pytest.mark.parametrize("damage, says", [
    (wrong_crc, "cannot be read (Bad CRC-32"),
    (damaged_deflate, "cannot be read"),
    (size_too_large, "holds 31,015 bytes but declares 31,025"),
    (size_too_small, "cannot be read (Bad CRC-32"),
    (encrypted, "is encrypted"),
    (method_99, "compression method 99"),
    (points_at_another_header, "overlaps"),
    (points_into_another_entry, "overlaps"),
])
def test_a_damaged_entry_is_refused_when_the_zip_opens(damage, says):
    # The victim is a request trace, which the reader used to read only when a page asked for it.
    with pytest.raises(WorkloadError) as err:
        open_zip(damage(good()), "w.zip")
    message = str(err.value)
    assert message.startswith("w.zip: entry ") and says in message and "\n" not in message
    assert VICTIM in message or "request-0001.jsonl" in message  # an overlap names the entry found to overlap


@pytest.mark.parametrize("name", [
    "../x", "a/../../x", "/tmp/x", "C:/x", "C:\\x", "..\\x", "a\\b.txt", "./x", "a//b", "a\nb.txt", "a\u202eb.txt",
    "x" * 256, "../",
])
def test_an_entry_whose_name_leaves_its_folder_or_is_not_plain_is_refused(name):
    with pytest.raises(WorkloadError) as err:
        open_zip(zipped({**members(), name: b"hello"}), "w.zip")
    assert str(err.value).startswith(f"w.zip: entry {name!r} ") and "\n" not in str(err.value)


def test_a_nul_in_a_stored_name_is_refused():
    d = zipped({**members(), "aXb.txt": b"hello"})
    d = d.replace(b"aXb.txt", b"a\0b.txt")  # in its local header and its directory record
    with pytest.raises(WorkloadError, match=r"entry 'a\\x00b.txt' holds a control"):
        open_zip(d, "w.zip")


@pytest.mark.parametrize("mode, says", [(stat.S_IFLNK | 0o777, "is a symbolic link"),
                                        (stat.S_IFIFO | 0o644, "is not a regular file or folder"),
                                        (stat.S_IFDIR | 0o755, "is not a regular file or folder")])
def test_a_link_or_other_special_entry_is_refused(mode, says):
    info = zipfile.ZipInfo("notes.txt")
    info.external_attr = mode << 16
    with pytest.raises(WorkloadError, match=f"w.zip: entry 'notes.txt' {says}"):
        open_zip(zipped([*members().items(), (info, b"/etc/passwd")]), "w.zip")


@pytest.mark.parametrize("name", ["request-0002.jsonl", "manifest.json", "README.txt"])
def test_two_entries_of_one_name_are_refused(name):
    entries = [*members().items(), (name, b"the other one")]
    if name == "README.txt":
        entries.insert(0, (name, b"the first one"))
    with pytest.raises(WorkloadError, match=f"w.zip: entry '{name}' appears twice"):
        open_zip(zipped(entries), "w.zip")


def test_harmless_extra_files_are_allowed_but_never_read():
    extras = {"README.txt": b"what this workload is", ".DS_Store": b"\0\0\0\1Bud1",
              "__MACOSX/": b"", "__MACOSX/w/._manifest.json": b"\0\5\26\7 macOS resource fork"}
    for prefix in ("", "w/"):
        workload = open_zip(zipped({**{prefix + n: d for n, d in members().items()}, **extras}), "w.zip")
        assert workload.entries == open_zip(good(), "w.zip").entries and workload.trace(workload.done[1]).complete


def test_a_deflate_stream_cut_short_of_or_past_its_declared_size_is_refused():
    """zipfile reads the declared compressed size only: one byte short can still give every byte and a good
    CRC (the stream's last bits are its end marker), so the stream's end is checked against the size."""
    d = good()
    declared = zipfile.ZipFile(io.BytesIO(d)).getinfo(VICTIM).compress_size
    for size in (declared - 1, declared + 1):
        cut = patched(d, central_record(d, VICTIM) + 20, "<I", size)
        with pytest.raises(WorkloadError, match=f"entry '{VICTIM}'"):
            open_zip(cut, "cut.zip")


def test_zips_written_stored_and_with_folder_records_open():
    workload = open_zip(zipped({"w/": b"", **{"w/" + n: d for n, d in members().items()}}, zipfile.ZIP_STORED), "w.zip")
    assert workload.trace(workload.done[0]).complete


def test_budgets_on_entries_directory_and_sizes(monkeypatch):
    data = good()
    monkeypatch.setattr(zip_checks, "MAX_ENTRIES", 100)  # the zip has 101
    with pytest.raises(WorkloadError, match="w.zip: its directory lists more entries than a workload zip holds"):
        open_zip(data, "w.zip")
    end = data.rindex(b"PK\x05\x06")
    lying = patched(patched(data, end + 8, "<H", 1), end + 10, "<H", 1)  # zipfile reads the records, not this count
    with pytest.raises(WorkloadError, match="w.zip: 101 entries; a workload zip holds at most 100"):
        open_zip(lying, "w.zip")
    monkeypatch.setattr(zip_checks, "MAX_ENTRIES", 1000)
    monkeypatch.setattr(zip_checks, "MAX_DIRECTORY_BYTES", 1000)
    with pytest.raises(WorkloadError, match="w.zip: its directory lists more entries"):
        open_zip(data, "w.zip")
    monkeypatch.setattr(zip_checks, "MAX_DIRECTORY_BYTES", 10**6)
    monkeypatch.setattr(workload_folder, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(WorkloadError, match="w.zip: entry 'manifest.json' declares 49,879 bytes; at most 1,000 are read"):
        open_zip(data, "w.zip")


def test_the_command_line_refuses_a_damaged_zip_in_one_line(tmp_path, capsys):
    path = tmp_path / "damaged.zip"
    path.write_bytes(wrong_crc(good()))
    assert main(["stats", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: damaged.zip: entry '{VICTIM}' cannot be read") and "\n" not in err
    assert "BadZipFile" not in err


@pytest.fixture
def app_session(monkeypatch, tmp_path):
    import streamlit as st
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    monkeypatch.setattr(st, "session_state", {})
    return tmp_path / "uploads"


@pytest.mark.parametrize("damage", [wrong_crc, damaged_deflate, encrypted, method_99])
def test_the_app_refuses_a_damaged_workload_upload_in_one_line_and_keeps_nothing(app_session, damage):
    from app.ui import workloads
    choice, error = workloads.open_upload("my\nrun.zip", damage(good()))
    assert choice is None and error.startswith(f"my?run.zip: entry '{VICTIM}' ") and "\n" not in error
    assert not (app_session / "workloads").exists() or not any((app_session / "workloads").iterdir())


def test_a_reader_failing_unexpectedly_on_an_upload_still_gives_one_line(app_session, monkeypatch):
    from app.ui import state, workloads

    def broken(*args, **kwargs):
        raise KeyError("what a reader's bug would raise")

    monkeypatch.setattr(state, "loads_trace", broken)
    assert state.open_upload("odd\r\ntrace.jsonl", b"{}") == "odd??trace.jsonl: cannot be read (KeyError)"
    monkeypatch.setattr(workloads, "open_zip", broken)
    assert workloads.open_upload("w.zip", good()) == (None, "w.zip: cannot be read (KeyError)")


# ---------------------------------------------------------------- a batched workload's rows

def batched(manifest_rows=4, trace_rows=4, batch_rows=4) -> bytes:
    """The bundled batched workload with its row count rewritten where asked (None: no "batch" in the manifest)."""
    files = dict(members(BATCHED))
    manifest = json.loads(files["manifest.json"])
    if manifest_rows is None:
        del manifest["batch"]
    else:
        manifest["batch"]["rows"] = manifest_rows
    files["manifest.json"] = json.dumps(manifest).encode()
    for name in files:
        if name.startswith("request-"):
            files[name] = files[name].replace(b'"batch": {"rows": 4,', f'"batch": {{"rows": {trace_rows},'.encode(), 1)
    batch_lines = files["batch.jsonl"].split(b"\n", 1)
    files["batch.jsonl"] = batch_lines[0].replace(b'"rows": 4,', f'"rows": {batch_rows},'.encode()) + b"\n" + batch_lines[1]
    return zipped(files)


def test_a_batched_workload_whose_counts_agree_opens():
    workload = open_zip(batched(), "b.zip")
    assert workload.batch_trace()["header"]["rows"] == 4


@pytest.mark.parametrize("rows, says", [
    (dict(manifest_rows=3), "b.zip/request-0001.jsonl: the trace says it ran in a batch of 4 rows, the manifest in a batch of 3"),
    (dict(manifest_rows=None), "b.zip/request-0001.jsonl: the trace says it ran in a batch of 4 rows, the manifest alone"),
    (dict(manifest_rows=8, trace_rows=8), "b.zip/batch.jsonl: the batch has 4 rows, the manifest says 8"),
])
def test_a_batched_workload_whose_row_counts_differ_is_refused(rows, says):
    workload = open_zip(batched(**rows), "b.zip")
    with pytest.raises(WorkloadError) as err:
        workload.runs() if rows.get("manifest_rows") != 8 else workload.batch_trace()
    assert str(err.value).startswith(says)


@pytest.mark.parametrize("value", [{"rows": 0}, {"rows": 257}, {"rows": "4"}, {"rows": True}, {"rows": 4, "more": 1}, [4]])
def test_a_manifest_batch_that_is_not_a_row_count_is_refused(value):
    files = dict(members(BATCHED))
    manifest = json.loads(files["manifest.json"])
    manifest["batch"] = value
    files["manifest.json"] = json.dumps(manifest).encode()
    with pytest.raises(WorkloadError, match="b.zip: manifest field 'batch' must be"):
        open_zip(zipped(files), "b.zip")


def test_the_app_refuses_a_batched_upload_whose_batch_trace_disagrees(app_session):
    from app.ui import workloads
    choice, error = workloads.open_upload("b.zip", batched(manifest_rows=8, trace_rows=8))
    assert choice is None and error == "b.zip/batch.jsonl: the batch has 4 rows, the manifest says 8"
