"""Linear layers on the CPU that cost about the same for 1 to 9 rows: oneDNN with pre-packed weights.

Why: a verify pass feeds K+1 rows through every linear layer. On a CPU, PyTorch's
default `F.linear` goes to MKL's sgemm, whose small-M path on some CPUs (measured on
an AMD EPYC, see bench/verify_cost.py) costs about M times one row: the 576 x 49,152
output layer took 10 ms at 1 row, 23 ms at 2 and 34 ms at 3. One row at batch 1 is
memory-bound (the weights are read once), so M rows should cost about the same.
oneDNN's inner-product primitive with its weights reordered once into its blocked
layout (what inductor's freezing pass does, `torch.ops.mkldnn._reorder_linear_weight`)
has that shape: a nearly flat cost over 1..9 rows.

How: `packed_twin(model)` returns a second module tree that shares every parameter of
`model` (embeddings, norms, the original weights) but whose `nn.Linear` layers call
oneDNN with a packed copy of their weight. Nothing in `model` changes, so Hugging
Face's own `generate` on it still runs what a user would run; the engine's forward
and prefill (verify, draft steps, and the plain decoding loop alike) go through the
twin. Attention, caches (any transformers `Cache`), masks and positions are the
model's own code: only the matrix products change, and only in rounding (float32,
same operands; tests check widths 1..9 against the reference within float tolerance).

A twin's packed weights are a copy: if the model's weights change after the twin was
built (training), build it again.
"""
import copy
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class RowPolicy:
    """Which path a layer takes for M rows: F.linear below `dense_below`, else oneDNN with
    fewer than `pad_to` rows padded by zero rows (discarded after the product). Rows of a
    matrix product do not mix, so padding changes no real row's value; it exists because
    oneDNN's kernel for 1-2 rows was measured slower than for 3 on the output layer (the
    decoder's 2-row products follow the same rule; no difference could be measured there)."""

    dense_below: int = 1
    pad_to: int = 1


# Chosen from measurements on a 2-core AMD EPYC (docs/benchmarks.md, verify cost on the CPU;
# bench/results/verify-cost-*.md).
DEFAULT_POLICY = {"decoder": RowPolicy(dense_below=2, pad_to=3), "output": RowPolicy(dense_below=1, pad_to=3)}


def available(model: nn.Module) -> bool:
    """oneDNN packing applies: CPU, float32, not sharded over ranks (a tensor-parallel shard's
    weights are DTensors that a packed copy would gather whole), and this torch build has the ops."""
    p = next(model.parameters(), None)
    return (p is not None and p.device.type == "cpu" and p.dtype == torch.float32
            and getattr(model, "tp_size", None) in (None, 1)
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear(nn.Module):
    """`F.linear(x, weight, bias)` through oneDNN with the weight reordered once."""

    def __init__(self, linear: nn.Linear, policy: RowPolicy) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # shared with the model: the reference and the M < dense_below path
        self.bias = linear.bias
        self.policy = policy
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())  # (N, K), blocked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows < self.policy.dense_below or torch.is_grad_enabled():
            return nn.functional.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features)  # (M, K); oneDNN wants 2-D, contiguous
        if rows < self.policy.pad_to:
            flat = torch.cat([flat, flat.new_zeros(self.policy.pad_to - rows, self.in_features)])
        out = torch.ops.mkldnn._linear_pointwise(flat.contiguous(), self.packed, self.bias, "none", [], "")
        return out[:rows].reshape(*x.shape[:-1], self.out_features)  # (..., N)


def output_layer_name(model: nn.Module) -> str | None:
    """Dotted name of the output layer (`lm_head` for HF causal LMs), if it is a linear layer: an
    nn.Linear or a twin's stand-in for one (PackedLinear, f32_rows_kernel.RowsLinear: both keep
    in_features and out_features)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if get else None
    if not (isinstance(head, nn.Linear) or (hasattr(head, "in_features") and hasattr(head, "out_features"))):
        return None
    return next((n for n, m in model.named_modules() if m is head), None)


def twin_with(model: nn.Module, make) -> nn.Module:
    """A copy of `model`'s module tree sharing its parameters (no weight is copied), with every
    nn.Linear replaced by `make(linear, is_output_layer)`: how the packed twin here and the rows
    twin (engine/models/f32_rows_kernel.py) are built."""
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    twin = copy.deepcopy(model, memo=shared)  # new modules, same tensors
    head = output_layer_name(twin)
    for name, module in list(twin.named_modules()):
        if isinstance(module, nn.Linear):
            parent_name, _, attr = name.rpartition(".")
            parent = twin.get_submodule(parent_name) if parent_name else twin
            setattr(parent, attr, make(module, name == head))
    return twin.eval()


def packed_twin(model: nn.Module, policy: dict[str, RowPolicy] | None = None) -> nn.Module:
    """A copy of `model`'s module tree sharing its parameters, with every Linear packed for oneDNN.

    `policy` overrides DEFAULT_POLICY for "decoder" (every Linear but the output layer)
    or "output"."""
    policy = {**DEFAULT_POLICY, **(policy or {})}
    return twin_with(model, lambda linear, output: PackedLinear(linear, policy["output" if output else "decoder"]))
