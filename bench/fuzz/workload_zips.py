"""A workload's files as a zip, and the zip-level changes a workload zip meets: the folder at the top
or inside one folder, stored or deflated, harmless extra members (valid); damage to a member that is
read, unsafe names, links and duplicates, bombs (refused).
"""
import random

from bench.fuzz import zips
from bench.fuzz.cases import ACCEPT, EITHER, REFUSE
from bench.fuzz.sandbox import Places
from bench.fuzz.zips import Member

MANIFEST = "manifest.json"
BOMB_BYTES = 24 * 2**20  # what one bomb unpacks to: well inside the child's memory budget, read whole


def members_of(files: dict[str, bytes], rng: random.Random, prefix: str = "") -> list[Member]:
    stored = rng.random() < 0.2
    return [Member(prefix + name, data, stored=stored) for name, data in files.items()]


def valid_zip(files: dict[str, bytes], rng: random.Random) -> tuple[bytes, str]:
    """The workload zipped in one of the ways that must open."""
    style = rng.choice(["top", "folder", "folder", "directory-entries", "extra-member", "shuffled", "manifest-last"])
    prefix = "my workload/" if style in ("folder", "directory-entries") else ""
    members = members_of(files, rng, prefix)
    if style == "directory-entries":
        members.insert(0, Member(prefix, b""))
    elif style == "extra-member":
        members.append(Member(rng.choice(["README.txt", "notes/run.log", "prompts.jsonl"]), b"not part of the workload\n"))
    elif style == "shuffled":
        rng.shuffle(members)
    elif style == "manifest-last":
        members.sort(key=lambda m: m.name.endswith(MANIFEST))
    return zips.build(members), f"zip {style}"


def read_members(files: dict[str, bytes], manifest: dict) -> list[str]:
    """The members the reader opens: the manifest, the done requests' traces, the batch trace."""
    done = [e["file"] for e in manifest["requests"] if e["status"] == "done"]
    return [MANIFEST, *done, *(["batch.jsonl"] if "batch" in manifest and "batch.jsonl" in files else [])]


def damaged_zip(files: dict[str, bytes], manifest: dict, rng: random.Random) -> tuple[bytes, str, str]:
    """Zip-level damage to a member the reader opens; it must be refused (never crash)."""
    prefix = rng.choice(["", "w/"])
    data = zips.build(members_of(files, rng, prefix))
    name = rng.choice(read_members(files, manifest))
    if rng.random() < 0.15:
        cut = data[: rng.randrange(len(data))]
        return cut, f"zip cut at byte {len(cut)} of {len(data)}", REFUSE
    damaged, words, must_fail = zips.damage(data, prefix + name, rng)
    return damaged, words, REFUSE if must_fail else EITHER


def unsafe_zip(files: dict[str, bytes], rng: random.Random, places: Places) -> tuple[bytes, str]:
    """A valid workload plus a member no workload may hold: it must be refused."""
    target = f"{places.canary}/planted.txt"
    hostile = rng.choice(["../canary/planted.txt", target, "C:/canary/planted.txt", "..\\canary\\planted.txt",
                          "w/../../canary/planted.txt", "./../canary/planted.txt", "C:\\Windows\\planted.txt"])
    how = rng.choice(["name", "link", "link-as-request", "duplicate", "duplicate-manifest", "all-under-dotdot"])
    members = members_of(files, rng)
    if how == "name":
        members.append(Member(hostile, b"written by an unpacker that trusts names\n"))
    elif how == "link":
        members.append(Member(rng.choice(["link", "w/link", "request-9999.jsonl"]), target.encode(), link=True))
    elif how == "link-as-request":
        extra = Member(members[-1].name, rng.choice([target, "../canary/" + "keep-me.txt"]).encode(), link=True)
        members.append(extra)  # the same name twice, the second a link
    elif how == "duplicate":
        i = rng.randrange(len(members))
        members.append(Member(members[i].name, members[i].data))
    elif how == "duplicate-manifest":
        members.insert(0, Member(MANIFEST, b'{"format": "not this one"}'))
    else:
        members = [Member("../" + m.name, m.data) for m in members]
    words = f"unsafe zip: {how}" + (f" {hostile!r}" if how == "name" else "")
    return zips.build(members), words


def bomb_zip(files: dict[str, bytes], manifest: dict, rng: random.Random) -> tuple[bytes, str, str]:
    members = members_of(files, rng)
    how = rng.choice(["declared-huge", "request-bomb", "manifest-bomb", "unread-bomb"])
    if how == "declared-huge":
        data = zips.build(members)
        name = rng.choice([m.name for m in members])
        return zips.declared_huge(data, name), f"{name} declares 4 GiB", REFUSE
    if how == "unread-bomb":  # a large member the reader never opens: harmless
        members.append(Member("logs/huge.txt", zips.bomb(BOMB_BYTES)))
        return zips.build(members), f"an unread member of {BOMB_BYTES:,} bytes", ACCEPT
    name = MANIFEST if how == "manifest-bomb" else rng.choice(read_members(files, manifest)[1:] or [MANIFEST])
    members = [Member(m.name, zips.bomb(BOMB_BYTES)) if m.name == name else m for m in members]
    return zips.build(members), f"{name} replaced by {BOMB_BYTES:,} bytes that deflate to little", REFUSE
