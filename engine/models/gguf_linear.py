"""The int4 target path: a twin of a float32 model whose linear layers multiply by the GGUF file's blocks.

Why: the chat target ships as a Q4_1 GGUF of about 96 MB (Q4_1 decoder layers and a Q8_0 output
layer). Dequantised to float32 it is 538 MB, all of it read at every step. On a 2-core CPU that
read, not the arithmetic, sets the float32 step time; the blocks are 5.6 times smaller.

How: `gguf_twin(model, gguf_file)` returns a second module tree sharing every parameter of `model`
(embeddings, norms, the float weights), like engine/models/cpu_linear.py's packed twin, in which each
`nn.Linear` that the file stores as Q4_1 or Q8_0 is a `GGUFLinear` over that tensor's blocks
(engine/models/gguf_blocks.py), run by engine/models/gguf_kernel.c. Layers stored in float stay as
they are; other block types are refused (gguf_blocks.check_supported).

Exactness, checked when the twin is built (on CHECKED_ROWS rows of every layer; the tests check
every row): each layer's blocks, decoded, equal the loaded float32 model's weight bit for bit
(transformers made that weight from the same file), after the row order
transformers uses for rotary attention (q and k rows of a llama GGUF are interleaved per head). The
kernel forms each weight exactly so and keeps activations and sums in float32 (tests read the
kernel's matrix back with identity inputs). The twin's logits therefore differ from the float32
model's only by the order of float32 sums; greedy speculation on the twin equals greedy plain
decoding on the twin token for token, since both run the same kernels. The token embedding lookup
stays the float32 table (a gather, not a matrix product); the tied output layer runs its Q8_0 blocks.
"""
import copy
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from engine.models import gguf_kernel
from engine.models.errors import ModelLoadError
from engine.models.gguf_blocks import (
    BlockTensor,
    GGUFFile,
    UnsupportedWeights,
    block_tensor,
    check_supported,
    dequantize,
    read_gguf,
)

TIED_OUTPUT = "token_embd.weight"  # a GGUF without output.weight ties the output layer to the embedding
CHECKED_ROWS = 64  # rows per layer compared bit for bit at load (every_row=True compares all)


class GGUFLinear(nn.Module):
    """`F.linear(x, W, bias)` with W held as GGUF blocks; float32 in, float32 out."""

    def __init__(self, tensor: BlockTensor, bias: torch.Tensor | None,
                 activations: str = gguf_kernel.ACTIVATIONS_FLOAT32) -> None:
        super().__init__()
        self.in_features, self.out_features = tensor.in_features, tensor.out_features
        self.kind, self.gguf_name = tensor.kind, tensor.name
        self.register_buffer("blocks", tensor.blocks, persistent=False)  # (N, K/32 * block bytes) uint8
        # the blocks repacked for the 8-bit activations, made on first use and kept: a graph compiled for
        # int4-a8 holds this tensor, so a switch to float32 and back must find the same one
        self.register_buffer("packed", None, persistent=False)
        self.bias = bias
        self.use_activations(activations)

    def use_activations(self, activations: str) -> None:
        """float32, or int8: each block of 32 activations rounded to 8 bits first (gguf_kernel.c)."""
        if activations == gguf_kernel.ACTIVATIONS_INT8 and self.packed is None:
            self.packed = gguf_kernel.pack_i8(self.blocks, self.kind, self.out_features, self.in_features)
        self.activations = activations
        self.matrix = gguf_kernel.BlockMatrix(self.blocks, self.kind, self.out_features, self.in_features, activations,
                                              self.packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # (M, K)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        if torch.compiler.is_compiling():  # the kernel as an operator a compiled graph can hold
            native = gguf_kernel.NATIVE[0]  # set before compiling (prepare_compiled): no build while a graph is traced
            weights = self.blocks if self.activations == gguf_kernel.ACTIVATIONS_FLOAT32 else self.packed
            if native is not None:
                y = native(flat, weights, gguf_kernel.KINDS[self.kind, self.activations], self.out_features)
            else:
                y = gguf_kernel.compiled_linear(flat, weights, self.kind, self.out_features, self.activations)
        else:
            y = self.matrix(flat)  # (M, N)
        if self.bias is not None:
            y += self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


@dataclass(frozen=True)
class GGUFWeights:
    """What a trace header records about the int4 path (engine/trace/schema.py, TARGET_WEIGHTS)."""

    file: str  # the GGUF file's name (never a machine's path)
    tensor_types: dict[str, int]  # block type -> linear layers run on it
    float_layers: int  # linear layers the file stores in float, left as they are
    weight_bytes: int  # bytes of blocks read per forward
    layer_names: dict[str, str] = field(default_factory=dict, repr=False)  # model name -> GGUF name

    def describe(self) -> dict:
        return {"file": self.file, "tensor_types": dict(sorted(self.tensor_types.items())),
                "float_layers": self.float_layers, "weight_bytes": self.weight_bytes}


def rotary_row_order(rows: int, heads: int) -> torch.Tensor:
    """Row i of transformers' weight is row order[i] of a llama GGUF's q or k weight: the file keeps
    each head's rotary pairs interleaved, transformers splits them into halves."""
    if heads <= 0 or rows % (2 * heads):
        return torch.arange(rows)
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


def row_orders(config, rows: int) -> list[torch.Tensor]:
    """The row orders tried, in turn: as stored, then the rotary order for each head count."""
    heads = {getattr(config, "num_attention_heads", 0) or 0, getattr(config, "num_key_value_heads", 0) or 0}
    return [torch.arange(rows)] + [rotary_row_order(rows, h) for h in sorted(heads) if h]


def checked_rows(rows: int, every_row: bool) -> torch.Tensor:
    """The rows compared with the float model: all, or CHECKED_ROWS spread evenly (every head of a
    q or k weight gets some, so a wrong row order cannot pass)."""
    if every_row or rows <= CHECKED_ROWS:
        return torch.arange(rows)
    return torch.linspace(0, rows - 1, CHECKED_ROWS).round().long()


def matching_blocks(tensor: BlockTensor, weight: torch.Tensor, config, module_name: str,
                    every_row: bool = False) -> BlockTensor:
    """The tensor's blocks in the row order that decodes to `weight` exactly, or a clear refusal."""
    if (tensor.out_features, tensor.in_features) != tuple(weight.shape):
        raise ModelLoadError(f"GGUF tensor {tensor.name} is {tensor.out_features}x{tensor.in_features} but "
                             f"{module_name} is {tuple(weight.shape)}: not the file this model was loaded from")
    rows = checked_rows(tensor.out_features, every_row)
    for order in row_orders(config, tensor.out_features):
        picked = BlockTensor(tensor.name, tensor.kind, len(rows), tensor.in_features, tensor.blocks[order[rows]])
        if torch.equal(dequantize(picked), weight[rows]):
            return tensor if torch.equal(order, torch.arange(len(order))) else tensor.rows(order)
    raise ModelLoadError(f"GGUF tensor {tensor.name} ({tensor.kind}) decoded is not {module_name}'s float32 weight "
                         "in any row order tried: the int4 path runs only on the file the float32 model was made from")


def gguf_tensor_names(model: nn.Module, file: GGUFFile) -> dict[str, str]:
    """Each nn.Linear's name in the model -> its tensor in the file (gguf's own name map for the
    file's architecture; a missing output.weight means the output layer is tied to the embedding)."""
    import gguf

    arch_id = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}.get(file.architecture)
    if arch_id is None:
        raise UnsupportedWeights(f"GGUF architecture {file.architecture!r} is unknown to the gguf package")
    name_map = gguf.get_tensor_name_map(arch_id, getattr(model.config, "num_hidden_layers", 0))
    stored = set(file.tensors)
    names = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            found = name_map.get_name(name + ".weight", try_suffixes=(".weight",))
            if found == "output.weight" and found not in stored:
                found = TIED_OUTPUT
            if found is None or found not in stored:
                raise UnsupportedWeights(f"no tensor in the GGUF file for the model's layer {name}")
            check_supported(file.tensors[found])  # refuse another block type before any work
            names[name] = found
    return names


def check_model(model: nn.Module) -> None:
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        raise ModelLoadError(f"the int4 target path runs a float32 model on the CPU (this one is {p.dtype} on "
                             f"{p.device.type}): its kernel is a CPU kernel")


def gguf_twin(model: nn.Module, gguf_file: Path, every_row: bool = False) -> tuple[nn.Module, GGUFWeights]:
    """A twin of `model` sharing its parameters, with every quantised linear layer on the file's blocks.
    Each layer's decoded blocks are compared with the model's weight on CHECKED_ROWS rows (all rows
    with `every_row`: 5 s more for the chat target on a 2-core machine; the tests do it)."""
    check_model(model)
    file = read_gguf(gguf_file)
    tensors = file.tensors
    names = gguf_tensor_names(model, file)
    gguf_kernel.library()  # a missing compiler is said now, not at the first forward
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    twin = copy.deepcopy(model, memo=shared)  # new modules, same tensors: no weight is copied
    counts: Counter = Counter()
    floats, weight_bytes = 0, 0
    for name, gguf_name in names.items():
        if tensors[gguf_name].type_name not in gguf_kernel.BLOCK_TYPES:
            floats += 1  # stored in float: the model's own layer is the file's
            continue
        module = twin.get_submodule(name)
        blocks = matching_blocks(block_tensor(file, tensors[gguf_name]), module.weight.detach(), model.config, name,
                                 every_row)
        parent_name, _, attr = name.rpartition(".")
        setattr(twin.get_submodule(parent_name) if parent_name else twin, attr, GGUFLinear(blocks, module.bias))
        counts[blocks.kind] += 1
        weight_bytes += blocks.nbytes
    return twin.eval(), GGUFWeights(Path(gguf_file).name, dict(counts), floats, weight_bytes, names)


# ---------------------------------------------------------------- the own decoder on the blocks

class StackedLinear(nn.Module):
    """Layers of different block types (or some stored in float) computed one after the other, their
    outputs side by side: what a fused projection is when its parts cannot share one block matrix."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(layers)
        self.in_features = layers[0].in_features
        self.out_features = sum(layer.out_features for layer in layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([layer(x) for layer in self.parts], dim=-1)  # (..., N1 + N2 + ...)


def fused(layers: list[GGUFLinear]) -> GGUFLinear:
    """One GGUFLinear over the layers' blocks stacked by rows: a row's output is the same kernel's dot
    product over the same blocks, so the fused layer's outputs are the parts' outputs side by side."""
    first = layers[0]
    blocks = torch.cat([layer.blocks for layer in layers])  # (N1 + N2 + ..., K/32 * block bytes)
    tensor = BlockTensor("+".join(layer.gguf_name for layer in layers), first.kind, blocks.shape[0],
                         first.in_features, blocks)
    biases = [layer.bias for layer in layers]
    has_bias = any(b is not None for b in biases)
    bias = torch.cat([b if b is not None else torch.zeros(layer.out_features) for b, layer in zip(biases, layers)]) \
        if has_bias else None
    return GGUFLinear(tensor, bias, first.activations)


def use_activations(module: nn.Module, activations: str) -> None:
    """Every GGUFLinear in `module` on `activations` (float32, or int8 as llama.cpp multiplies)."""
    for layer in module.modules():
        if isinstance(layer, GGUFLinear):
            layer.use_activations(activations)


def fused_source(twin: nn.Module):
    """For engine/models/llama.py `from_hf(model, linear_source=...)`: the int4 twin's layers of each
    fused group (q/k/v; gate/up; a single o, down or output layer), as one GGUFLinear where they share
    a block type, else side by side (StackedLinear). The own decoder then runs exactly the twin's
    weights: the same blocks, the same float layers."""
    def source(names: list[str]) -> nn.Module:
        layers = [twin.get_submodule(name) for name in names]
        if len(layers) == 1:
            return layers[0]
        kinds = {layer.kind if isinstance(layer, GGUFLinear) else None for layer in layers}
        if None not in kinds and len(kinds) == 1:
            return fused(layers)
        return StackedLinear(layers)
    return source
