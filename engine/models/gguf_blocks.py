"""A GGUF file's quantised weights as they are stored: blocks of 32 weights with their float16 scales.

The engine's int4 target path (engine/models/gguf_linear.py) multiplies by these blocks directly,
so nothing is quantised a second time. Two block types are read:
- Q4_1, 20 bytes: d (float16 scale), m (float16 minimum), 16 bytes of 4-bit q; w = d * q + m.
  Byte j holds weight j in its low nibble and weight j + 16 in its high nibble.
- Q8_0, 34 bytes: d (float16 scale), 32 signed bytes q; w = d * q.
Float tensors (F32, F16, BF16) need no kernel: their layers stay on the float path. Every other type
(Q4_0, Q5_*, the K-quants Q2_K..Q6_K, IQ*) is refused by name.

`dequantize` is the reference decoder, written with torch: d * q is exact in float32 (11 and 8
significant bits at most), so d * q + m rounds once, as the gguf package's decoder (which
transformers uses to make its float32 copy) does; tests hold both to the same bits.
"""
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.models.errors import ModelLoadError
from engine.trace.schema import GGUF_BLOCK_TYPES

BLOCK_WEIGHTS = 32
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}  # bytes per block of each type the kernel reads
KERNEL_TYPES = GGUF_BLOCK_TYPES
FLOAT_TYPES = ("F32", "F16", "BF16")  # layers stored in float stay nn.Linear


class UnsupportedWeights(ModelLoadError):
    """A GGUF tensor of a type the int4 path cannot run; the message names it."""


@dataclass(frozen=True)
class BlockTensor:
    """One weight matrix as its blocks: row n (one output feature) is in_features / 32 blocks."""

    name: str  # the GGUF tensor name, e.g. blk.0.attn_q.weight
    kind: str  # one of KERNEL_TYPES
    out_features: int
    in_features: int
    blocks: torch.Tensor  # (out_features, in_features // 32 * BLOCK_BYTES[kind]) uint8

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def rows(self, order: torch.Tensor) -> "BlockTensor":
        """The same blocks with the rows (output features) in `order`: whole rows move, nothing is re-encoded."""
        return BlockTensor(self.name, self.kind, self.out_features, self.in_features, self.blocks[order].contiguous())


# ---------------------------------------------------------------- reading the file
# GGUF v2/v3, little-endian: magic, version, tensor count, key-value count; the key-values; one
# record per tensor (name, dimensions, type, offset); then, aligned, the tensor data. The gguf
# package's reader parses every key-value into numpy views (8 s for the chat file's 98k tokenizer
# strings on a busy 2-core machine); this one skips what it does not need.

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
MAX_TENSORS = 100_000


@dataclass(frozen=True)
class TensorRecord:
    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-varying axis first (in_features, out_features)
    type_id: int
    offset: int  # from the start of the file

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType
        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"type {self.type_id}"


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    architecture: str
    tensors: dict[str, TensorRecord]


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("Q")
        if n > len(self.data) - self.at:
            raise ValueError("a string runs past the end of the file")
        text = self.data[self.at:self.at + n].decode("utf-8", "replace")
        self.at += n
        return text

    def value(self, kind: int):
        """One key-value's value; arrays are skipped (None): the tensors need none of them."""
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item == STRING:
                for _ in range(count):
                    self.at += 8 + self.take("Q")
            elif item in SCALARS:
                self.at += count * struct.calcsize(SCALARS[item])
            else:
                raise ValueError(f"array of value type {item}")
            return None
        if kind not in SCALARS:
            raise ValueError(f"value type {kind}")
        return self.take(SCALARS[kind])


def read_gguf(path: Path) -> GGUFFile:
    """The architecture and the tensor records of a GGUF file; a damaged file is refused by name."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:4] != b"GGUF":
                raise ValueError("no GGUF magic")
            cur = _Cursor(data)
            cur.at = 4
            version, tensor_count, kv_count = cur.take("I"), cur.take("Q"), cur.take("Q")
            if version not in (2, 3) or tensor_count > MAX_TENSORS:
                raise ValueError(f"version {version} with {tensor_count} tensors")
            fields = {}
            for _ in range(kv_count):
                key = cur.string()
                fields[key] = cur.value(cur.take("I"))
            records = []
            for _ in range(tensor_count):
                name = cur.string()
                dims = cur.take("I")
                shape = tuple(cur.take("Q") for _ in range(min(dims, 8)))
                records.append((name, shape, cur.take("I"), cur.take("Q")))
    except (OSError, ValueError, struct.error) as err:
        raise ModelLoadError(f"could not read {path} as a GGUF file: {err}") from err
    alignment = int(fields.get("general.alignment") or 32)
    start = -(-cur.at // alignment) * alignment
    tensors = {n: TensorRecord(n, shape, t, start + off) for n, shape, t, off in records}
    return GGUFFile(Path(path), str(fields.get("general.architecture") or ""), tensors)


def check_supported(record: TensorRecord) -> None:
    kind = record.type_name
    if kind not in KERNEL_TYPES and kind not in FLOAT_TYPES:
        raise UnsupportedWeights(
            f"GGUF tensor {record.name} is {kind}: the int4 target path runs {', '.join(KERNEL_TYPES)} blocks "
            f"(and keeps {', '.join(FLOAT_TYPES)} layers in float); use --target-weights float32 for this file")


def block_tensor(gguf: GGUFFile, record: TensorRecord) -> BlockTensor:
    """The blocks of a Q4_1 or Q8_0 tensor, copied out of the file."""
    check_supported(record)
    kind = record.type_name
    if len(record.shape) != 2 or record.shape[0] % BLOCK_WEIGHTS:
        raise UnsupportedWeights(f"GGUF tensor {record.name}: shape {list(record.shape)} is not a matrix of whole blocks")
    in_features, out_features = record.shape  # GGUF lists the fastest axis first
    row_bytes = in_features // BLOCK_WEIGHTS * BLOCK_BYTES[kind]
    with open(gguf.path, "rb") as f:
        f.seek(record.offset)
        raw = f.read(out_features * row_bytes)
    if len(raw) != out_features * row_bytes:
        raise ModelLoadError(f"{gguf.path}: tensor {record.name} runs past the end of the file")
    data = np.frombuffer(raw, dtype=np.uint8).reshape(out_features, row_bytes)
    return BlockTensor(record.name, kind, out_features, in_features, torch.from_numpy(data.copy()))


def _halves(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte `start` of every block, widened to float32 (exact): (N, nb, 1)."""
    return blocks[..., start:start + 2].contiguous().view(torch.float16).float()


def dequantize(t: BlockTensor) -> torch.Tensor:
    """(out_features, in_features) float32: every weight as the format defines it."""
    b = t.blocks.view(t.out_features, -1, BLOCK_BYTES[t.kind])  # (N, nb, bytes)
    d = _halves(b, 0)
    if t.kind == "Q4_1":
        qs = b[..., 4:20]
        q = torch.cat([qs & 15, qs >> 4], dim=-1).float()  # (N, nb, 32): low nibbles are weights 0..15
        w = d * q + _halves(b, 2)
    else:
        w = d * b[..., 2:34].contiguous().view(torch.int8).float()
    return w.reshape(t.out_features, t.in_features)
