"""The ranks torchrun started: which one this process is, its device, and the group they form.

torchrun (`python -m torch.distributed.run`) starts one process per rank and tells each its
place through the environment: RANK (0..WORLD_SIZE-1 over all nodes), LOCAL_RANK (its index
on its node, which picks its GPU) and WORLD_SIZE, plus the rendezvous address. The backend
follows the device: NCCL where torch sees CUDA (rank r on cuda:LOCAL_RANK), gloo on CPUs.

Every collective waits at most `timeout_s` for the other ranks: a rank that dies or stops
answering ends the run within that time instead of leaving the others blocked for good.
"""
import json
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.config import SettingsError

DEFAULT_TIMEOUT_S = 600  # as long as NCCL's own default: rank 0 loads the draft while the others wait
RANK_RECORD_BYTES = 2048  # one rank's host, device and load error, as UTF-8 JSON padded with zeros
MAX_HOST_BYTES = 128  # a host name is at most 64 bytes on Linux
MAX_ERROR_BYTES = 600  # with the host, the JSON keeps within RANK_RECORD_BYTES


class RankError(RuntimeError):
    """One rank's own failure that the other ranks cannot know about; that rank reports it."""


@dataclass(frozen=True)
class World:
    """This process's place among the ranks."""

    rank: int
    local_rank: int
    world_size: int
    backend: str  # "nccl" or "gloo"
    device: torch.device  # cuda:LOCAL_RANK, or cpu
    timeout_s: float

    @property
    def is_lead(self) -> bool:
        """Rank 0 drafts, decides and writes; the others follow."""
        return self.rank == 0


_current: World | None = None  # set once this process has joined the group


def current_world() -> World | None:
    """The group this process has joined, if any (the command line's error reporter asks)."""
    return _current


def launched_rank() -> int | None:
    """RANK from torchrun's environment (which also sets LOCAL_RANK and WORLD_SIZE), or None for a plain process."""
    rank = os.environ.get("RANK", "")
    if not (rank.isdigit() and os.environ.get("LOCAL_RANK", "").isdigit() and os.environ.get("WORLD_SIZE", "").isdigit()):
        return None
    return int(rank)


def launched_world_size() -> int:
    size = os.environ.get("WORLD_SIZE", "1")
    return int(size) if size.isdigit() else 1


def check_launch(tp: int) -> None:
    """--tp must match the number of processes torchrun started (cheap: before any model loads)."""
    world = launched_world_size() if launched_rank() is not None else 1
    if tp < 1:
        raise SettingsError(f"--tp must be at least 1, got {tp}")
    if tp > 1 and launched_rank() is None:
        raise SettingsError(f"--tp {tp} runs one process per rank: start it with "
                            f"torchrun --nproc-per-node {tp} -m engine run --tp {tp} ...")
    if tp != world:
        hint = f"pass --tp {world}" if tp == 1 else f"start {tp} processes or pass --tp {world}"
        raise SettingsError(f"torchrun started {world} processes but --tp is {tp}: {hint} "
                            "(the target is sharded over every rank, and only one process may write the trace)")


def backend_and_device(local_rank: int, requested: str | None) -> tuple[str, torch.device]:
    """NCCL on cuda:LOCAL_RANK where torch sees CUDA, else gloo on the CPU (transformers binds the same).

    --device may name the same kind of device only: transformers builds its device mesh on
    the machine's accelerator whatever the engine asks for."""
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    if requested is not None and torch.device(requested).type != kind:
        hide = " (CUDA_VISIBLE_DEVICES= hides the GPUs to run on the CPU)" if kind == "cuda" else ""
        raise SettingsError(f"--device {requested}: under --tp each rank runs on this machine's "
                            f"{'GPUs' if kind == 'cuda' else 'CPU'}{hide}")
    if kind == "cpu":
        return "gloo", torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise RankError(f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()}")
    return "nccl", torch.device("cuda", local_rank)


def rank_device(requested: str | None = None) -> torch.device:
    """The device this rank will run on (checked before it joins the group)."""
    return backend_and_device(int(os.environ.get("LOCAL_RANK", "0")), requested)[1]


def join_world(requested_device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> World:
    """Join the group torchrun set up (once per process; a second call returns the same world)."""
    global _current
    if _current is not None:
        return _current
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend, device = backend_and_device(local_rank, requested_device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                                device_id=device if backend == "nccl" else None)
    _current = World(dist.get_rank(), local_rank, dist.get_world_size(), backend, device, timeout_s)
    return _current


def leave_world() -> None:
    """Tear the group down (a clean exit; a failed run leaves it to the process's end)."""
    global _current
    if dist.is_initialized():
        dist.destroy_process_group()
    _current = None


def _own_record(world: World, error: str | None) -> torch.Tensor:
    host = socket.gethostname().encode()[:MAX_HOST_BYTES].decode(errors="ignore")
    error = None if error is None else error.encode()[:MAX_ERROR_BYTES].decode(errors="ignore")
    data = json.dumps({"host": host, "device": str(world.device), "local_rank": world.local_rank, "error": error},
                      ensure_ascii=False).encode()
    record = torch.zeros(RANK_RECORD_BYTES, dtype=torch.uint8)
    record[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    return record.to(world.device)


def rank_layout(world: World, error: str | None = None) -> list[dict]:
    """Every rank's host, device, local rank and `error` (why it failed to load, or None), in rank
    order. A collective: every rank calls it, a failed one too, so all learn of the failure at once.

    Plain bytes over the group, never pickled objects."""
    records = [torch.zeros(RANK_RECORD_BYTES, dtype=torch.uint8, device=world.device) for _ in range(world.world_size)]
    dist.all_gather(records, _own_record(world, error))
    layout = []
    for rank, record in enumerate(records):
        data = bytes(record.cpu().tolist()).rstrip(b"\0")
        layout.append({"rank": rank, **json.loads(data.decode())})
    return layout
