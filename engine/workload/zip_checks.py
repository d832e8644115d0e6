"""A workload zip checked whole when it is opened, before any of it is believed.

A zip is an upload from a stranger, so its central directory is only a claim. `open_checked_zip`
refuses, in one line naming the zip and the entry:
- a central directory too large for a workload's entries (looked at before zipfile builds a record per entry);
- more than MAX_ENTRIES entries, or declared sizes adding up to more than the budget;
- a name that is not a plain relative path: empty or longer than MAX_ENTRY_NAME_CHARS, a leading "/",
  a backslash, a colon (drive letters), an empty, "." or ".." part, a character that is not printable;
- the same name twice (zipfile keeps only the last, so a reader and a checker could see different files);
- a link or any other entry that is neither a regular file nor a folder (the Unix mode in external_attr);
- an encrypted entry, or one compressed other than stored or deflated;
- entries whose bytes overlap (a record pointing into another entry: how overlapping zip bombs work);
- an entry that cannot be read to its end, whose CRC-32 differs, or that holds another size than it declares;
- a deflated entry whose stream does not end exactly where its declared compressed size does (zipfile
  stops at the declared size, so a stream cut by a byte can still give every byte and a good CRC).
Every entry is read once, in full, with a cap (declared sizes are never trusted), so a damaged entry is
refused here and not later when a page reads it. Files the reader never asks for (a README, macOS's
__MACOSX/ and .DS_Store) are allowed once they pass the same checks: they are never read again.

May import: engine.workload.manifest (WorkloadError), engine.workload.prompts (MAX_REQUESTS) and the standard library.
"""
import io
import stat
import struct
import zipfile
import zlib
from typing import Callable

from engine.workload.manifest import WorkloadError
from engine.workload.prompts import MAX_REQUESTS

MAX_WORKLOAD_BYTES = 512 * 2**20  # unpacked: 2000 requests of a quarter MB; a zip claiming more is refused
# A request trace per request, the manifest and batch.jsonl, each possibly twice more (a folder record, and the
# "._" twin macOS adds under __MACOSX/), and room for a few notes.
MAX_ENTRIES = 3 * (MAX_REQUESTS + 2) + 100
MAX_ENTRY_NAME_CHARS = 255
MAX_DIRECTORY_BYTES = MAX_ENTRIES * 1024  # ~46 bytes of record, a name and extra fields each
COMPRESSIONS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}  # what zip tools write by default
LOCAL_HEADER_BYTES = 30  # a local file header before its name, extra field and data
UTF8_NAME = 0x800  # the flag bit of a name stored as UTF-8 (else code page 437)
# What zipfile and zlib raise on damaged bytes: a bad header, CRC or stream, a truncated entry, an unknown method.
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, NotImplementedError, RuntimeError, EOFError,
              OSError, ValueError, struct.error, OverflowError)


def open_checked_zip(data: bytes, source: str, limit_of: Callable[[str], int]) -> zipfile.ZipFile:
    """The zip, after every check in the module's list. `limit_of(file name)` caps one entry's bytes
    (the name without its folders)."""
    check_directory_size(data, source)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except ZIP_ERRORS as err:
        raise WorkloadError(f"{source}: not a readable zip file ({why(err)})") from None
    infos = archive.infolist()
    if len(infos) > MAX_ENTRIES:
        raise WorkloadError(f"{source}: {len(infos):,} entries; a workload zip holds at most {MAX_ENTRIES:,}")
    if sum(info.file_size for info in infos) > MAX_WORKLOAD_BYTES:
        raise WorkloadError(f"{source}: unpacks to more than {MAX_WORKLOAD_BYTES:,} bytes")
    seen: set[str] = set()
    for info in infos:
        check_entry(info, source)
        if info.filename in seen:
            raise WorkloadError(f"{source}: entry {info.filename!r} appears twice")
        seen.add(info.filename)
    check_no_overlap(infos, archive.start_dir, source)
    for info in infos:
        read_entry(archive, info, 0 if info.is_dir() else limit_of(info.filename.rsplit("/", 1)[-1]), source)
        check_stream_end(data, info, source)
    return archive


def check_directory_size(data: bytes, source: str) -> None:
    """Refuse a central directory larger than a workload's before zipfile parses it: zipfile keeps a record
    of a few hundred bytes per entry, so a directory of tiny records would cost far more memory than the upload."""
    try:
        # zipfile's own lookup of the end record (a private helper, but the very one ZipFile runs next),
        # so this check and the parse that follows read the same directory.
        end = zipfile._EndRecData(io.BytesIO(data))
    except ZIP_ERRORS as err:
        raise WorkloadError(f"{source}: not a readable zip file ({why(err)})") from None
    if end is None:
        raise WorkloadError(f"{source}: not a zip file")
    if end[zipfile._ECD_SIZE] > MAX_DIRECTORY_BYTES or end[zipfile._ECD_ENTRIES_TOTAL] > MAX_ENTRIES:
        raise WorkloadError(f"{source}: its directory lists more entries than a workload zip holds ({MAX_ENTRIES:,})")


def check_entry(info: zipfile.ZipInfo, source: str) -> None:
    """One entry's name, type, encryption and compression: what can be refused before reading it."""
    name = info.orig_filename  # zipfile cuts `filename` at a NUL; the name as stored keeps it
    problem = name_problem(name)
    if problem:
        raise WorkloadError(f"{source}: entry {name!r} {problem}")
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the zip tool recorded no Unix mode
    allowed = (0, stat.S_IFDIR) if info.is_dir() else (0, stat.S_IFREG)
    if kind not in allowed:
        what = "is a symbolic link" if kind == stat.S_IFLNK else "is not a regular file or folder"
        raise WorkloadError(f"{source}: entry {name!r} {what}; a workload zip holds files only")
    if info.flag_bits & 0x1:
        raise WorkloadError(f"{source}: entry {name!r} is encrypted; zip the folder without a password")
    if info.compress_type not in COMPRESSIONS:
        raise WorkloadError(f"{source}: entry {name!r} uses compression method {info.compress_type}; "
                            f"only {' and '.join(COMPRESSIONS.values())} entries are read")


def name_problem(name: str) -> str | None:
    """What is wrong with an entry's name as a relative path inside one folder tree, or None."""
    if not name or len(name) > MAX_ENTRY_NAME_CHARS:
        return f"must be a name of 1 to {MAX_ENTRY_NAME_CHARS} characters"
    if not name.isprintable():
        return "holds a control or other unprintable character"
    if "\\" in name or ":" in name:
        return "holds a backslash or a colon (a Windows path or drive); entries are named with forward slashes"
    if name.startswith("/"):
        return "is an absolute path"
    parts = name.removesuffix("/").split("/")  # a folder's record ends with "/"
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' part; entries stay inside the zip's folders"
    return None


def check_no_overlap(infos: list[zipfile.ZipInfo], directory_start: int, source: str) -> None:
    """Each entry's header and data end before the next entry begins, and the last before the directory.
    The local extra field is not counted, so this is the least an entry takes: it never refuses a sound zip."""
    ordered = sorted(infos, key=lambda info: info.header_offset)
    starts = [info.header_offset for info in ordered[1:]] + [directory_start]
    for info, next_start in zip(ordered, starts):
        stored_name = info.orig_filename.encode("utf-8" if info.flag_bits & UTF8_NAME else "cp437")
        end = info.header_offset + LOCAL_HEADER_BYTES + len(stored_name) + info.compress_size
        if end > next_start:
            raise WorkloadError(f"{source}: entry {info.orig_filename!r} overlaps the next entry or the directory")


def read_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, source: str) -> bytes:
    """An entry's bytes, read to its end so its CRC-32 is checked, at most `limit` of them whatever it declares."""
    if info.file_size > limit:
        raise WorkloadError(f"{source}: entry {info.filename!r} declares {info.file_size:,} bytes; "
                            f"at most {limit:,} are read")
    try:
        with archive.open(info) as f:
            data = f.read(limit + 1)
    except ZIP_ERRORS as err:
        raise WorkloadError(f"{source}: entry {info.filename!r} cannot be read ({why(err)})") from None
    if len(data) != info.file_size:  # zipfile stops at the declared size, but not short of it
        raise WorkloadError(f"{source}: entry {info.filename!r} holds {len(data):,} bytes but declares {info.file_size:,}")
    return data


def check_stream_end(data: bytes, info: zipfile.ZipInfo, source: str) -> None:
    """A deflated entry's raw stream ends at its declared compressed size: no byte missing, none left over."""
    if info.compress_type != zipfile.ZIP_DEFLATED or info.is_dir():
        return
    try:
        name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)  # from the local header
        start = info.header_offset + LOCAL_HEADER_BYTES + name_len + extra_len
        stream = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, as zip stores it
        for at in range(start, start + info.compress_size, 2**20):  # in pieces: output is capped by read_entry already
            stream.decompress(data[at:min(at + 2**20, start + info.compress_size)], 2**20)
            while stream.unconsumed_tail:
                stream.decompress(stream.unconsumed_tail, 2**20)
    except ZIP_ERRORS as err:
        raise WorkloadError(f"{source}: entry {info.filename!r} cannot be read ({why(err)})") from None
    if not stream.eof or stream.unused_data:
        raise WorkloadError(f"{source}: entry {info.filename!r}: its compressed data does not end where its "
                            f"declared size ({info.compress_size:,} bytes) says")


def why(err: Exception) -> str:
    """A library's error as a short line: its message, or its type when it has none."""
    text = " ".join(str(err).split())[:200]
    return text or type(err).__name__
