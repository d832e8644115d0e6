"""The app's Streamlit settings (.streamlit/config.toml) take effect when it is started from the
project's root, as the README's first command does."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READ = "from streamlit import config; config.get_config_options(force_reparse=True); print(config.get_option('{}'))"


def option_from_root(name: str) -> str:
    out = subprocess.run([sys.executable, "-c", READ.format(name)], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_no_full_garbage_collection_after_every_script_run():
    """The job poller reruns every 0.5 s; a full collection each time held the GIL long enough
    to slow a live run's verify pass several times over (see the file's comment)."""
    assert option_from_root("runner.postScriptGC") == "False"


def test_no_file_watchers_per_visitor():
    """Each session's source watchers made a new visitor's first page cost 3-4x the server CPU
    (see the file's comment); a class opening the app together waited for all of them."""
    assert option_from_root("server.fileWatcherType") == "none"
