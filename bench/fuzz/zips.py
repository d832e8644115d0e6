"""Zips built from a folder's files, and damage done to them at the zip's own level.

`build` writes members as given (names are never cleaned, so '../x', '/abs', 'C:/x' and backslashes
stay as written; a member may be a symbolic link; a name may come twice). The damage functions
patch one member's record in the central directory (and its local header where zipfile reads it):
its CRC, its compressed bytes, its sizes, its flags, its compression method.
"""
import random
import stat
import struct
import warnings
import zipfile
from dataclasses import dataclass
from io import BytesIO

CENTRAL = b"PK\x01\x02"
END = b"PK\x05\x06"
# Offsets inside a central directory record and a local file header (APPNOTE 4.3.7, 4.3.12).
C_FLAGS, C_METHOD, C_CRC, C_COMPRESSED, C_SIZE, C_NAME_LEN, C_LOCAL = 8, 10, 16, 20, 24, 28, 42
L_FLAGS, L_METHOD, L_NAME_LEN = 6, 8, 26


@dataclass(frozen=True)
class Member:
    name: str
    data: bytes
    link: bool = False  # a symbolic link whose target is `data`
    stored: bool = False


def build(members: list[Member]) -> bytes:
    buffer = BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name: that is the point
        with zipfile.ZipFile(buffer, "w") as z:
            for m in members:
                info = zipfile.ZipInfo(m.name, date_time=(2026, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_STORED if m.stored else zipfile.ZIP_DEFLATED
                if m.link:
                    info.create_system = 3  # Unix, so the mode bits below mean a link
                    info.external_attr = (stat.S_IFLNK | 0o777) << 16
                z.writestr(info, m.data)
    return buffer.getvalue()


@dataclass(frozen=True)
class Record:
    """Where one member's records lie in the zip's bytes."""

    name: str
    central: int  # offset of its central directory record
    local: int  # offset of its local file header
    data: int  # offset of its compressed bytes
    compressed: int  # their length


def records(data: bytes) -> list[Record]:
    end = data.rindex(END)
    count, _, start = struct.unpack_from("<HII", data, end + 10)
    found, at = [], start
    for _ in range(count):
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", data, at + C_NAME_LEN)
        name = data[at + 46: at + 46 + name_len].decode("utf-8", "replace")
        local = struct.unpack_from("<I", data, at + C_LOCAL)[0]
        compressed = struct.unpack_from("<I", data, at + C_COMPRESSED)[0]
        l_name, l_extra = struct.unpack_from("<HH", data, local + L_NAME_LEN)
        found.append(Record(name, at, local, local + 30 + l_name + l_extra, compressed))
        at += 46 + name_len + extra_len + comment_len
    return found


def patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def damage(data: bytes, name: str, rng: random.Random) -> tuple[bytes, str, bool]:
    """One kind of zip-level damage to the member `name`: the zip, the words, and whether reading the
    member must fail (more compressed bytes than there are, or an unchanged size, may still read)."""
    r = next(r for r in records(data) if r.name == name)
    how = rng.choice(["crc", "deflate", "size", "compressed-size", "encrypted", "patched-data", "method",
                      "method-lzma", "local-name"])
    if how == "crc":
        crc = struct.unpack_from("<I", data, r.central + C_CRC)[0]
        return patch(data, r.central + C_CRC, "<I", crc ^ (1 << rng.randrange(32))), f"{name}: CRC changed", True
    if how == "deflate":
        out = bytearray(data)
        i = r.data + rng.randrange(max(1, r.compressed))
        out[i] ^= 1 << rng.randrange(8)
        return bytes(out), f"{name}: a bit of its compressed bytes flipped", True
    if how == "size":
        size = struct.unpack_from("<I", data, r.central + C_SIZE)[0]
        new = rng.choice([0, max(0, size - 1), size + 1, size * 2 + 7])
        # Declared larger, the member still reads whole and its CRC holds: zipfile stops at the data's end.
        return patch(data, r.central + C_SIZE, "<I", new), f"{name}: declared size {size} -> {new}", new < size
    if how == "compressed-size":
        new = rng.choice([max(0, r.compressed - 1), r.compressed // 2, r.compressed + 3])
        words = f"{name}: compressed size {r.compressed} -> {new}"
        return patch(data, r.central + C_COMPRESSED, "<I", new), words, new < r.compressed
    if how in ("encrypted", "patched-data"):
        bit = 0x1 if how == "encrypted" else 0x20
        flags = struct.unpack_from("<H", data, r.central + C_FLAGS)[0] | bit
        data = patch(data, r.central + C_FLAGS, "<H", flags)
        return patch(data, r.local + L_FLAGS, "<H", flags), f"{name}: flag {bit:#x} set ({how})", True
    if how.startswith("method"):
        method = 14 if how == "method-lzma" else rng.choice([1, 6, 12, 99])
        data = patch(data, r.central + C_METHOD, "<H", method)
        return patch(data, r.local + L_METHOD, "<H", method), f"{name}: compression method -> {method}", True
    out = bytearray(data)  # the local header's name differs from the central directory's
    out[r.local + 30] ^= 0x01
    return bytes(out), f"{name}: its local header names another file", True


def declared_huge(data: bytes, name: str) -> bytes:
    """A member that claims to unpack to 4 GiB (the reader must refuse before reading)."""
    r = next(r for r in records(data) if r.name == name)
    return patch(data, r.central + C_SIZE, "<I", 2**32 - 1)


def bomb(size: int) -> bytes:
    """`size` bytes that deflate to almost nothing, as a member's content."""
    return b"{" + b" " * (size - 2) + b"}"
