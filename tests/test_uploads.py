"""Uploads stay in a private folder, are never written through a link, and have a size limit;
messages never show the server's absolute folders."""
import os
import stat

import pytest

from app.ui import state


@pytest.fixture
def private_uploads(monkeypatch):
    monkeypatch.delenv("SPECLAB_UPLOADS_DIR", raising=False)
    return state.uploads_dir()


def test_upload_folder_is_private_to_this_server(private_uploads):
    mode = stat.S_IMODE(os.stat(private_uploads).st_mode)
    assert mode == 0o700 and private_uploads.name.startswith("speclab-uploads-")
    assert state.uploads_dir() == private_uploads  # one per process
    assert private_uploads.parent.name != "speclab-uploads"  # not the old shared, predictable name


def test_upload_is_never_written_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    folder = tmp_path / "uploads"
    folder.mkdir()
    (folder / "abc.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        state.store_upload(folder / "abc.jsonl", b"{}")
    assert victim.read_text() == "keep me"


def test_stored_upload_is_private_and_a_different_file_of_that_name_is_refused(tmp_path):
    path = tmp_path / "uploads" / "abc.jsonl"
    state.store_upload(path, b"one")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    state.store_upload(path, b"one")  # the same bytes again: kept as is
    with pytest.raises(OSError, match="other content"):
        state.store_upload(path, b"two")
    assert path.read_bytes() == b"one"


def test_oldest_uploads_are_pruned(tmp_path):
    for i in range(5):
        path = tmp_path / f"{i}.jsonl"
        path.write_text("x")
        os.utime(path, ns=(i * 10**9, i * 10**9))
    state.prune_uploads(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.jsonl", "4.jsonl"]


def test_too_large_upload_is_refused_before_reading(monkeypatch):
    monkeypatch.setattr(state, "MAX_UPLOAD_BYTES", 100)
    assert "larger than" in state.open_upload("big.jsonl", b"x" * 101)


def test_messages_show_paths_relative_to_the_app(private_uploads, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    text = (f"{private_uploads}/a.jsonl; {tmp_path}/runs/live.jsonl; {state.ROOT}/assets/models/x; "
            f"{state.ROOT}")
    shown = state.shown_paths(text)
    assert shown == "uploads/a.jsonl; runs/live.jsonl; assets/models/x; ."
