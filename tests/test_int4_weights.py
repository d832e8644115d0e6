"""The int4 target path: linear layers on a GGUF file's blocks (engine/models/gguf_*.py).

The blocks here come from this file's own reference encoder (Q4_1: per block of 32, d = (max - min) / 15,
m = min; Q8_0: d = max |w| / 127), written with the gguf package's writer into a real GGUF file for a
tiny llama model, with q and k rows interleaved per head as llama.cpp's converter stores them. The
float model is given the decoded weights, as transformers gives a GGUF-loaded model.
"""
import ctypes
import platform
import shutil

import numpy as np
import pytest
import torch

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.mode import RunMode
from engine.models import gguf_kernel, linear_paths
from engine.models.gguf_blocks import BlockTensor, UnsupportedWeights, block_tensor, dequantize, read_gguf
from engine.models.gguf_linear import GGUFLinear, gguf_twin
from engine.models.loading import ModelLoadError, wrap_model
from engine.trace.schema import WEIGHTS_FLOAT32, WEIGHTS_INT4
from tests.tiny import tiny_llama, tiny_tokenizer

needs_cc = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler for the kernel")
# Float32 products of the same float32 operands summed in another order (the kernel per block of 32,
# BLAS in its own blocking): for the tiny model's O(1) activations, differences of a few 1e-6.
ACROSS_KERNELS = 1e-4


# ---------------------------------------------------------------- the test's own reference encoder

def encode_q4_1(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) float32 -> (N, K/32*20) uint8 blocks and the (N, K) float32 values they stand for."""
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    lo, hi = g.min(-1, keepdims=True), g.max(-1, keepdims=True)
    d = ((hi - lo) / 15).astype(np.float16)
    m = lo.astype(np.float16)
    safe = np.where(d == 0, np.float16(1), d).astype(np.float32)
    q = np.clip(np.rint((g - m.astype(np.float32)) / safe), 0, 15).astype(np.uint8)  # (N, nb, 32)
    packed = q[..., :16] | (q[..., 16:] << 4)  # byte j: weight j low, weight j + 16 high
    blocks = np.concatenate([d.view(np.uint8), m.view(np.uint8), packed], axis=-1)  # (N, nb, 20)
    values = d.astype(np.float32) * q.astype(np.float32) + m.astype(np.float32)
    return blocks.reshape(n, -1), values.reshape(n, k).astype(np.float32)


def encode_q8_0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    d = (np.abs(g).max(-1, keepdims=True) / 127).astype(np.float16)
    safe = np.where(d == 0, np.float16(1), d).astype(np.float32)
    q = np.clip(np.rint(g / safe), -127, 127).astype(np.int8)
    blocks = np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=-1)  # (N, nb, 34)
    return blocks.reshape(n, -1), (d.astype(np.float32) * q.astype(np.float32)).reshape(n, k)


ENCODERS = {"Q4_1": encode_q4_1, "Q8_0": encode_q8_0}


def llama_cpp_row_order(w: np.ndarray, heads: int) -> np.ndarray:
    """How llama.cpp's converter stores q and k: each head's two rotary halves interleaved."""
    n = w.shape[0]
    return w.reshape(heads, 2, n // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_blocks(kind: str, n: int, k: int, seed: int) -> tuple[BlockTensor, torch.Tensor]:
    w = np.random.default_rng(seed).normal(0, 0.2, (n, k)).astype(np.float32)
    blocks, values = ENCODERS[kind](w)
    return BlockTensor("w", kind, n, k, torch.from_numpy(blocks)), torch.from_numpy(values)


# ---------------------------------------------------------------- a tiny model and its GGUF file

GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def write_tiny_gguf(model, path, types: dict[str, str]) -> None:
    """Quantise `model`'s linear layers into a GGUF file at `path` (types: GGUF name -> Q4_1, Q8_0 or
    F32; unnamed layers Q4_1) and set the model's weights to what the file decodes to."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", model.model.embed_tokens.weight.detach().numpy())
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        parts = name.split(".")
        gguf_name = "output.weight" if name == "lm_head" else f"blk.{parts[2]}.{GGUF_NAMES[parts[-1]]}.weight"
        kind = types.get(gguf_name, "Q4_1")
        w = module.weight.detach().numpy().copy()
        if kind == "F32":
            writer.add_tensor(gguf_name, w)
            continue
        heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}.get(parts[-1])
        stored = llama_cpp_row_order(w, heads) if heads else w
        blocks, values = ENCODERS[kind](stored)
        writer.add_tensor(gguf_name, blocks, raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
        if heads:  # back to transformers' order: the inverse of llama_cpp_row_order
            n = values.shape[0]
            values = values.reshape(heads, n // heads // 2, 2, -1).swapaxes(1, 2).reshape(values.shape)
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_target(tmp_path, types: dict[str, str] | None = None):
    model = tiny_llama(3, 2, 32)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(model, path, types or {"output.weight": "Q8_0"})
    loaded = wrap_model("tiny-gguf", model, tiny_tokenizer())
    loaded.gguf_file = path
    return loaded


# ---------------------------------------------------------------- blocks and the kernel

@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_blocks_decode_to_the_values_the_encoder_meant(kind):
    tensor, values = random_blocks(kind, 8, 96, seed=1)
    assert torch.equal(dequantize(tensor), values)  # bit for bit: d * q is exact, + m rounds once


@needs_cc
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_kernels_matrix_is_every_decoded_weight(kind):
    tensor, values = random_blocks(kind, 37, 64, seed=2)  # 37 = 9 groups of 4 and one column alone
    back = gguf_kernel.linear(torch.eye(64), tensor.blocks, kind, 37)  # row i of I @ W^T is column i of W^T
    assert torch.equal(back.T, values)


@needs_cc
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_kernel_multiplies_like_float64_and_a_row_ignores_its_batch(kind):
    # 51 outputs: groups of 4 columns beside one row, then 2 + 1 left over
    tensor, values = random_blocks(kind, 51, 96, seed=3)
    x = torch.randn(23, 96, generator=torch.Generator().manual_seed(4))
    y = gguf_kernel.linear(x, tensor.blocks, kind, 51)
    assert torch.allclose(y.double(), x.double() @ values.double().T, atol=ACROSS_KERNELS, rtol=0)
    for start, rows in ((0, 1), (5, 2), (7, 3), (2, 5), (11, 9), (1, 10)):  # every tile shape the kernel has
        part = gguf_kernel.linear(x[start:start + rows].contiguous(), tensor.blocks, kind, 51)
        assert torch.equal(part, y[start:start + rows])  # the same bits, whatever rows came with it


@needs_cc
def test_the_kernel_gives_the_same_bits_on_one_thread_and_two():
    tensor, _ = random_blocks("Q4_1", 640, 576, seed=6)  # above SERIAL_BELOW at one row: threaded
    assert 640 * 576 >= gguf_kernel.SERIAL_BELOW
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(7))
    before = torch.get_num_threads()
    try:
        out = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out.append(gguf_kernel.linear(x, tensor.blocks, "Q4_1", 640))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out[0], out[1])


@needs_cc
def test_the_kernel_refuses_arguments_it_cannot_read():
    tensor, _ = random_blocks("Q4_1", 4, 64, seed=5)
    with pytest.raises(ValueError, match="float32"):
        gguf_kernel.linear(torch.ones(2, 64, dtype=torch.float64), tensor.blocks, "Q4_1", 4)
    with pytest.raises(ValueError, match="do not make"):
        gguf_kernel.linear(torch.ones(2, 64), tensor.blocks, "Q4_1", 5)
    matrix = gguf_kernel.BlockMatrix(tensor.blocks, "Q4_1", 4, 64)  # the blocks checked once, here
    with pytest.raises(ValueError, match="contiguous float32 rows of 64"):
        matrix(torch.ones(64, 2).T)  # a transposed view: its rows are not where the kernel would read
    with pytest.raises(ValueError, match="contiguous float32 rows of 64"):
        matrix(torch.ones(2, 32))
    with pytest.raises(ValueError, match="do not make"):
        gguf_kernel.BlockMatrix(tensor.blocks[:, :20], "Q4_1", 4, 64)
    with pytest.raises(ValueError, match="no kernel for Q6_K"):
        gguf_kernel.BlockMatrix(tensor.blocks, "Q6_K", 4, 64)


# ---------------------------------------------------------------- 8-bit activations (the int4-a8 path)

def i8_reference(x: torch.Tensor, tensor: BlockTensor) -> torch.Tensor:
    """What gguf_kernel.c says the int8 functions compute, in float64 from the same quantised integers:
    per row and block of 32, d_x = max |x| / 127 and q_x = x * (127 / max |x|) rounded half to even."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    amax = xb.abs().amax(-1)  # (M, blocks) float32
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))  # float32, as the kernel divides
    q = torch.round(xb * inv[..., None]).clamp(-127, 127).double()  # torch.round: half to even, as nearbyintf
    d = (amax / 127).double()
    w = tensor.blocks.reshape(tensor.out_features, k // 32, -1)
    dw = w[..., 0:2].contiguous().view(torch.float16)[..., 0].double()  # (N, blocks)
    if tensor.kind == "Q4_1":
        mw = w[..., 2:4].contiguous().view(torch.float16)[..., 0].double()
        qw = torch.cat([w[..., 4:] & 15, w[..., 4:] >> 4], -1).double()  # weight j, then j + 16
    else:
        mw, qw = torch.zeros_like(dw), w[..., 2:].contiguous().view(torch.int8).double()
    isum = torch.einsum("mbj,nbj->mnb", q, qw)  # exact integers
    return (isum * dw[None] * d[:, None] + mw[None] * (d * q.sum(-1))[:, None]).sum(-1)


@needs_cc
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_8_bit_activations_compute_what_the_kernel_says_and_a_row_ignores_its_batch_and_threads(kind):
    # 13 blocks a row: groups of 8, 4 and 2, a zero block added; 18 (the chat target's 576): 8, 8 and 2
    for k in (416, 576):
        tensor, _ = random_blocks(kind, 21, k, seed=k)
        x = torch.randn(4, k, generator=torch.Generator().manual_seed(k))
        y = gguf_kernel.linear(x, tensor.blocks, kind, 21, gguf_kernel.ACTIVATIONS_INT8)
        # float32's rounding of the per-lane scale products and of the sums over up to 24 lanes: outputs are of
        # size ~10 here, a few float32 ulps of which are ~1e-5
        assert torch.allclose(y.double(), i8_reference(x, tensor), atol=1e-4, rtol=0)
    tensor, values = random_blocks(kind, 51, 96, seed=3)
    x = torch.randn(23, 96, generator=torch.Generator().manual_seed(4))
    x[3, :32] = 0  # an all-zero block: scale 0, no division by it
    y = gguf_kernel.linear(x, tensor.blocks, kind, 51, gguf_kernel.ACTIVATIONS_INT8)
    # 3 blocks a row: a zero block added, the 4 in one group. The integer sums are exact; what differs from float64
    # is float32's rounding of the per-lane scale products and of the sum over the lanes: a few float32 ulps of
    # outputs of size ~1.
    assert torch.allclose(y.double(), i8_reference(x, tensor), atol=1e-5, rtol=0)
    # Rounding activations to 8 bits moves each product by at most half a step of its block's scale (max |x| / 254):
    # far more than float32's rounding, far less than the outputs themselves.
    exact = x.double() @ values.double().T
    gap = (y.double() - exact).abs().max().item()
    assert ACROSS_KERNELS < gap < 0.05 * exact.abs().max().item()
    for start, rows in ((0, 1), (5, 2), (7, 3), (2, 5), (11, 9), (1, 10)):  # every tile shape the kernel has
        part = gguf_kernel.linear(x[start:start + rows].contiguous(), tensor.blocks, kind, 51, gguf_kernel.ACTIVATIONS_INT8)
        assert torch.equal(part, y[start:start + rows])
    big, _ = random_blocks(kind, 640, 576, seed=6)  # above SERIAL_BELOW: threaded
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(7))
    before = torch.get_num_threads()
    try:
        out = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out.append(gguf_kernel.linear(x, big.blocks, kind, 640, gguf_kernel.ACTIVATIONS_INT8))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out[0], out[1])


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the ISAs compared are x86's")
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_8_bit_kernel_gives_the_same_sums_in_each_isa_s_code(kind):
    """The kernel is compiled for the machine's widest code: VNNI's byte products (AVX-512 CPUs with VNNI), AVX2's,
    or plain C. Each is built here and run on the same packed matrix: the integer sums are exact in all three,
    and the two vector codes run the same float32 operations (the same fused multiply-adds), so they agree bit for
    bit; plain C may round its multiply-adds twice, so it agrees to float32's rounding."""
    from engine.models.kernel_build import build

    tensor, _ = random_blocks(kind, 40, 576, seed=11)
    if kind == "Q8_0":
        tensor.blocks.view(40, 18, 34)[:, ::5, 2::7] = 0x80  # -128: a value GGUF files may hold and our encoder does not
    packed = gguf_kernel.pack_i8(tensor.blocks, kind, 40, 576)
    x = torch.randn(6, 576, generator=torch.Generator().manual_seed(12))
    function = gguf_kernel.FUNCTIONS[kind, gguf_kernel.ACTIVATIONS_INT8]

    def run_on(flags: tuple[str, ...]) -> torch.Tensor:
        lib = build(gguf_kernel.SOURCE, flags, {function: (gguf_kernel.ARGTYPES, ctypes.c_int)}, "the test", "")
        y = torch.empty(6, 40)
        assert getattr(lib, function)(x.data_ptr(), 6, 576, packed.data_ptr(), 40, y.data_ptr(), 1) == 0
        return y

    native = gguf_kernel.linear(x, tensor.blocks, kind, 40, gguf_kernel.ACTIVATIONS_INT8)
    plain = ("-O3", "-fPIC", "-shared", "-Wall")
    assert torch.equal(run_on((*plain, "-march=x86-64-v3")), native)  # AVX2, FMA and F16C: every CPU this project met
    assert torch.allclose(run_on((*plain, "-march=x86-64")), native, atol=1e-4, rtol=0)
    assert torch.allclose(native.double(), i8_reference(x, tensor), atol=1e-4, rtol=0)


@needs_cc
def test_the_int4_a8_path_records_its_activations_and_greedy_speculation_equals_plain(tmp_path):
    import json

    from engine.run import run_to_trace
    from engine.stats.report import format_stats
    from engine.trace.format import TraceError, load_trace
    from engine.trace.schema import WEIGHTS_INT4_A8

    target = tiny_target(tmp_path)
    ids = [1, 2, 4, 6, 7, 8]
    target.use_weights(WEIGHTS_INT4)
    int4_logits = target.forward(ids, target.new_cache())
    target.use_weights(WEIGHTS_INT4_A8)
    assert {m.activations for m in target.runner.modules() if isinstance(m, GGUFLinear)} == {"int8"}
    a8_logits = target.forward(ids, target.new_cache())
    # Another arithmetic, the same model: the logits move, on average by far less than their spread. (Unrelated
    # logits of this spread would differ by about 1.1 standard deviations on average; 8-bit rounding through
    # this tiny model's 2 layers moved them by a few hundredths of one.)
    moved = (a8_logits - int4_logits).abs()
    assert 0 < moved.mean() < 0.1 * int4_logits.std()
    draft = wrap_model("tiny-draft", tiny_llama(1001, 1, 16), tiny_tokenizer())
    pair = Pair(target, draft, set())
    s = SpecSettings(k=3, temperature=0, max_new_tokens=16)
    spec = [t for c in speculative_generate(pair, ids, s) for t in c["committed_token_ids"]]
    assert spec[:16] == target_generate(target, ids, s, set())
    out = tmp_path / "a8.jsonl"
    run_to_trace(pair, "the cat sat", SpecSettings(k=2, max_new_tokens=6, seed=1), out, RunMode())
    trace = load_trace(out)
    assert trace.header["target_weights"]["path"] == WEIGHTS_INT4_A8
    assert trace.header["target_weights"]["activations"] == "int8"
    assert "TARGET WEIGHTS: int4-a8: the blocks of tiny.gguf as stored" in format_stats(trace)
    assert "8-bit activations" in format_stats(trace)
    lines = out.read_text().splitlines()
    for path, activations in ((WEIGHTS_INT4_A8, "float32"), (WEIGHTS_INT4, "int8")):  # a record that lies
        bad = {**trace.header, "target_weights": {**trace.header["target_weights"], "path": path,
                                                  "activations": activations}}
        out.write_text("\n".join([json.dumps(bad), *lines[1:]]) + "\n")
        with pytest.raises(TraceError, match=r"target_weights\.activations"):
            load_trace(out)
    target.use_weights(WEIGHTS_INT4)  # back: the same twin, float32 activations again
    assert torch.equal(target.forward(ids, target.new_cache()), int4_logits)


@needs_cc
def test_a_compiled_forward_follows_a_switch_between_int4_and_int4_a8(tmp_path):
    """Compiled forwards keep no guard on module attributes (engine/cycle/fast_forward.py compile_forward), and
    int4 and int4-a8 share their modules: a forward compiled on one path must not answer for the other."""
    from engine.cycle.fast_forward import FixedForward, new_fast_cache
    from engine.trace.schema import WEIGHTS_INT4_A8

    target = tiny_target(tmp_path)
    ids = [1, 2, 4, 6, 7, 8]
    eager = {}
    for weights in (WEIGHTS_INT4, WEIGHTS_INT4_A8):
        target.use_weights(weights)
        eager[weights] = target.forward(ids, target.new_cache())[-1]  # (V,)
    cache = new_fast_cache(target, 16)
    with torch.inference_mode():
        step = FixedForward(target, cache, 1, "compile")
        for weights in (WEIGHTS_INT4, WEIGHTS_INT4_A8, WEIGHTS_INT4):
            target.use_weights(weights)
            for layer in cache.layers:
                layer.cumulative_length.zero_()
            target.fill(ids[:-1], cache)  # the prompt's K/V on the same path, eager
            got = step(torch.tensor(ids[-1:]))[-1]
            # Each compiled step follows its own path's eager one up to inductor's summation order (int4-a8 rounds
            # activations to 8 bits after those sums, so one may round the other way); measured 2e-6 and 0 here,
            # against 0.13 between the two paths
            other = eager[WEIGHTS_INT4_A8 if weights == WEIGHTS_INT4 else WEIGHTS_INT4]
            assert (got - eager[weights]).abs().max() < (got - other).abs().max() / 10, weights
    assert set(step.compiled) == {WEIGHTS_INT4, WEIGHTS_INT4_A8}  # one compiled forward per path


needs_cxx = pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")),
                               reason="no C++ compiler for the native operator")


@needs_cc
@needs_cxx
def test_the_native_operator_gives_the_kernel_s_bits_and_refuses_what_the_kernel_cannot_take():
    assert gguf_kernel.prepare_compiled(), gguf_kernel.NATIVE_MISSING
    op = gguf_kernel.NATIVE[0]
    for kind, activations in gguf_kernel.FUNCTIONS:
        for rows, n, k in ((1, 51, 96), (5, 640, 576), (9, 7, 32)):  # tiles, tails, threaded above SERIAL_BELOW
            tensor, _ = random_blocks(kind, n, k, seed=rows)
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(n))
            weights = gguf_kernel.BlockMatrix(tensor.blocks, kind, n, k, activations).weights  # packed for int8
            assert torch.equal(op(x, weights, gguf_kernel.KINDS[kind, activations], n),
                               gguf_kernel.linear(x, tensor.blocks, kind, n, activations))
    tensor, _ = random_blocks("Q4_1", 4, 96, seed=5)
    with pytest.raises(RuntimeError, match="do not make"):  # the GGUF order where the packed one is read
        op(torch.ones(2, 96), tensor.blocks, gguf_kernel.KINDS["Q4_1", gguf_kernel.ACTIVATIONS_INT8], 4)
    tensor, _ = random_blocks("Q4_1", 4, 64, seed=5)
    with pytest.raises(RuntimeError, match="float32 rows of whole"):
        op(torch.ones(64, 2).T, tensor.blocks, 0, 4)  # a transposed view
    with pytest.raises(RuntimeError, match="float32 rows of whole"):
        op(torch.ones(2, 48), tensor.blocks, 0, 4)  # not whole blocks
    with pytest.raises(RuntimeError, match="do not make"):
        op(torch.ones(2, 64), tensor.blocks, 0, 5)  # more outputs than the blocks hold
    with pytest.raises(RuntimeError, match="do not make"):
        op(torch.ones(2, 64), tensor.blocks, 1, 4)  # Q4_1 bytes read as Q8_0 blocks
    with pytest.raises(RuntimeError, match="kind is 0-3"):
        op(torch.ones(2, 64), tensor.blocks, 4, 4)


@needs_cc
def test_the_python_operator_takes_the_kernel_s_layout_and_refuses_another():
    tensor, _ = random_blocks("Q8_0", 6, 96, seed=13)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(14))
    for activations in (gguf_kernel.ACTIVATIONS_FLOAT32, gguf_kernel.ACTIVATIONS_INT8):
        weights = gguf_kernel.BlockMatrix(tensor.blocks, "Q8_0", 6, 96, activations).weights
        assert torch.equal(gguf_kernel.compiled_linear(x, weights, "Q8_0", 6, activations),
                           gguf_kernel.linear(x, tensor.blocks, "Q8_0", 6, activations))
    with pytest.raises(ValueError, match="as the kernel reads it"):  # the GGUF order where the packed one is read
        gguf_kernel.compiled_linear(x, tensor.blocks, "Q8_0", 6, gguf_kernel.ACTIVATIONS_INT8)
    with pytest.raises(ValueError, match="as the kernel reads it"):  # 3.5 blocks: the packed size of 4, not whole blocks
        gguf_kernel.compiled_linear(torch.randn(3, 112), weights, "Q8_0", 6, gguf_kernel.ACTIVATIONS_INT8)


@needs_cc
@pytest.mark.parametrize("which", [pytest.param("native", marks=needs_cxx), "python"])
def test_a_compiled_graph_holds_the_int4_kernel_as_one_node_with_the_eager_result(monkeypatch, which):
    if which == "native":
        assert gguf_kernel.prepare_compiled(), gguf_kernel.NATIVE_MISSING
    else:
        monkeypatch.setattr(gguf_kernel, "NATIVE", [None])
    tensor, _ = random_blocks("Q4_1", 37, 64, seed=8)
    layer = GGUFLinear(tensor, None)
    x = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(9))
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.inference_mode():
        eager = layer(x)
        torch._dynamo.reset()
        assert torch.equal(torch.compile(layer, backend=keep, fullgraph=True)(x), eager)
    calls = [str(n.target) for n in graphs[0].graph.nodes if "gguf_linear" in str(n.target)]
    namespace = "speclab_native." if which == "native" else "speclab."
    assert len(calls) == 1 and calls[0].startswith(namespace), calls


def test_without_a_cxx_compiler_int4_graphs_keep_the_python_operator(monkeypatch):
    from engine.models import kernel_build

    def no_compiler(*args, **kwargs):
        raise kernel_build.KernelBuildError("the int4 operator for compiled graphs needs a C++ compiler")

    monkeypatch.setattr(kernel_build, "build_torch_op", no_compiler)
    monkeypatch.setattr(gguf_kernel, "load_torch_op", kernel_build.load_torch_op.__wrapped__)  # uncached
    monkeypatch.setattr(gguf_kernel, "library", lambda: None)  # the C kernel is there; only the C++ step fails
    monkeypatch.setattr(gguf_kernel, "NATIVE", [None])
    monkeypatch.setattr(gguf_kernel, "NATIVE_MISSING", [])
    gguf_kernel.prepare_compiled.cache_clear()
    try:
        assert gguf_kernel.prepare_compiled() is False
        assert "needs a C++ compiler" in gguf_kernel.NATIVE_MISSING[0] and gguf_kernel.NATIVE[0] is None
    finally:
        gguf_kernel.prepare_compiled.cache_clear()


# ---------------------------------------------------------------- the twin of a tiny model

@needs_cc
def test_a_tiny_models_twin_runs_the_files_blocks_and_greedy_speculation_equals_plain(tmp_path):
    target = tiny_target(tmp_path, {"output.weight": "Q8_0", "blk.1.ffn_up.weight": "F32"})
    ids = [1, 2, 4, 6, 7, 8]
    cache = target.new_cache()
    float_logits = target.forward(ids, cache)
    target.use_weights(WEIGHTS_INT4)
    assert target.describe_weights() == {
        "path": WEIGHTS_INT4, "activations": "float32", "file": "tiny.gguf",
        "tensor_types": {"Q4_1": 13, "Q8_0": 1}, "float_layers": 1, "weight_bytes": target.gguf_weights.weight_bytes}
    twin = target.runner
    assert isinstance(twin.lm_head, GGUFLinear) and twin.lm_head.kind == "Q8_0"
    assert isinstance(twin.model.layers[1].mlp.up_proj, torch.nn.Linear)  # stored in float: left as it is
    for module in twin.modules():  # every layer's matrix, read back through the kernel, is the float model's
        if isinstance(module, GGUFLinear):
            name = next(n for n, m in twin.named_modules() if m is module)
            back = module(torch.eye(module.in_features)).T
            assert torch.equal(back, target.model.get_submodule(name).weight), name
    assert target.runner_for(3) is twin and not linear_paths.applies(target)  # one path at every width
    int4_logits = target.forward(ids, target.new_cache())
    assert torch.allclose(int4_logits, float_logits, atol=ACROSS_KERNELS, rtol=0)
    draft = wrap_model("tiny-draft", tiny_llama(1001, 1, 16), tiny_tokenizer())
    pair = Pair(target, draft, set())
    s = SpecSettings(k=3, temperature=0, max_new_tokens=16)
    spec = [t for c in speculative_generate(pair, ids, s) for t in c["committed_token_ids"]]
    assert spec[:16] == target_generate(target, ids, s, set())
    target.use_weights(WEIGHTS_FLOAT32)
    assert target.runner is not twin and target.describe_weights() == {"path": WEIGHTS_FLOAT32}


@needs_cc
def test_the_own_decoder_on_the_blocks_fuses_what_shares_a_block_type_and_follows_the_twin(tmp_path):
    """--decoder own with --target-weights int4: the own decoder runs the twin's blocks, q/k/v and gate/up
    fused into one block matrix each where their block types agree, side by side where they do not
    (layer 1's up projection is stored in float here). Same kernel per row, so the same logits up to
    the order of float32 sums outside the products (attention, norms: ACROSS_KERNELS)."""
    from engine.models.gguf_linear import StackedLinear
    from engine.models.llama import LlamaDecoder
    from engine.trace.schema import DECODER_OWN

    target = tiny_target(tmp_path, {"output.weight": "Q8_0", "blk.1.ffn_up.weight": "F32"})
    ids = [1, 2, 4, 6, 7, 8]
    target.use_weights(WEIGHTS_INT4)
    twin_logits = target.forward(ids, target.new_cache())
    twin_greedy = target_generate(target, ids, SpecSettings(k=1, temperature=0, max_new_tokens=12), set())
    target.use_decoder(DECODER_OWN)
    own = target.runner
    assert isinstance(own, LlamaDecoder) and target.describe_decoder() == {"ran": DECODER_OWN}
    layer0, layer1 = own.model.layers
    assert isinstance(layer0.attention.wqkv, GGUFLinear) and layer0.attention.wqkv.kind == "Q4_1"
    assert isinstance(layer0.feed_forward.w13, GGUFLinear)  # gate and up: one matrix
    assert isinstance(layer1.feed_forward.w13, StackedLinear)  # Q4_1 gate beside the float up
    assert isinstance(own.lm_head, GGUFLinear) and own.lm_head.kind == "Q8_0"
    fused_qkv = torch.cat([target.model.get_submodule(f"model.layers.0.self_attn.{n}_proj").weight for n in "qkv"])
    assert torch.equal(layer0.attention.wqkv(torch.eye(32)).T, fused_qkv)  # the blocks decode to the float weights
    own_logits = target.forward(ids, target.new_cache())
    assert torch.allclose(own_logits, twin_logits, atol=ACROSS_KERNELS, rtol=0)
    s = SpecSettings(k=1, temperature=0, max_new_tokens=12)
    assert target_generate(target, ids, s, set()) == twin_greedy
    draft = wrap_model("tiny-draft", tiny_llama(1001, 1, 16), tiny_tokenizer())
    spec = [t for c in speculative_generate(Pair(target, draft, set()), ids, SpecSettings(k=3, temperature=0,
                                                                                            max_new_tokens=12))
            for t in c["committed_token_ids"]]
    assert spec[:12] == twin_greedy
    from engine.run import run_to_trace
    from engine.trace.format import load_trace
    out = tmp_path / "own-int4.jsonl"
    run_to_trace(Pair(target, draft, set()), "the cat sat", SpecSettings(k=2, max_new_tokens=6), out, RunMode())
    header = load_trace(out).header  # a valid trace that says both: the own decoder, on the int4 blocks
    assert header["decoder"]["target"] == {"ran": DECODER_OWN} and header["target_weights"]["path"] == WEIGHTS_INT4


@needs_cc
@pytest.mark.parametrize("decoder", ["hf", "own"])
def test_the_fast_path_compiles_the_int4_forward_with_the_kernel_as_one_operator(tmp_path, decoder):
    """--fast --capture compile on int4 weights: the graph calls the C kernel through speclab::gguf_linear,
    so the compiled forwards give the eager fast path's tokens and probabilities (up to the order of
    float32 sums in the parts inductor fuses: ACROSS_KERNELS)."""
    from engine.cycle import fast as fp
    from tests.test_fast_compile import close_records

    target = tiny_target(tmp_path, {"output.weight": "Q8_0"})
    target.use_weights(WEIGHTS_INT4)
    target.use_decoder(decoder)
    draft = wrap_model("tiny-draft", tiny_llama(1001, 1, 16), tiny_tokenizer())
    pair = Pair(target, draft, set())
    # Sampled only: its records carry both models' probabilities, which greedy's tokens alone would not check
    # (and each temperature compiles its own graphs, the slowest part of the suite on two cores).
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=12, seed=2, cache_layout="static")
    eager = list(fp.fast_generate(pair, [1, 2, 4], s, models=fp.FastModels.empty(pair, 2, 40)))
    compiled = list(fp.fast_generate(pair, [1, 2, 4], s, models=fp.FastModels.empty(pair, 2, 40, "compile")))
    close_records(compiled, eager)


@needs_cc
def test_capture_auto_keeps_one_choice_per_weights_path_and_decoder(tmp_path):
    """--capture auto's stored choice is keyed by the module that is compiled: float32 and int4 weights of
    one model, or the two decoders, are different forwards and must not share a measurement."""
    from engine.cycle.capture_choice import pair_key

    target = tiny_target(tmp_path)
    draft = wrap_model("tiny-draft", tiny_llama(1001, 1, 16), tiny_tokenizer())
    keys = {pair_key(target, draft, 2)}
    target.use_weights(WEIGHTS_INT4)
    keys.add(pair_key(target, draft, 2))
    target.use_decoder("own")
    keys.add(pair_key(target, draft, 2))
    target.use_weights(WEIGHTS_FLOAT32)
    keys.add(pair_key(target, draft, 2))
    assert len(keys) == 4


@needs_cc
def test_every_row_of_every_layer_is_checked_when_asked(tmp_path):
    target = tiny_target(tmp_path)
    _, weights = gguf_twin(target.model, target.gguf_file, every_row=True)
    assert weights.tensor_types == {"Q4_1": 14, "Q8_0": 1}
    with torch.no_grad():
        target.model.model.layers[0].mlp.down_proj.weight[5, 3] += 1e-3  # one weight off the file's
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_down\.weight .*decoded is not"):
        gguf_twin(target.model, target.gguf_file, every_row=True)


def test_a_model_without_a_gguf_file_or_with_an_unknown_path_is_refused():
    loaded = wrap_model("plain", tiny_llama(0, 1, 32), tiny_tokenizer())
    with pytest.raises(ModelLoadError, match="not loaded from one"):
        loaded.use_weights(WEIGHTS_INT4)
    with pytest.raises(ValueError, match="unknown target weights"):
        loaded.use_weights("int3")
    assert loaded.weights == WEIGHTS_FLOAT32


def test_other_block_types_are_refused_by_name(tmp_path):
    import gguf

    model = tiny_llama(0, 1, 32)
    path = tmp_path / "k-quant.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    # Q4_K: 144-byte blocks of 256 weights; two rows of 256 are enough to be stored
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((2, 144), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    record = read_gguf(path).tensors["blk.0.attn_q.weight"]
    with pytest.raises(UnsupportedWeights, match=r"blk\.0\.attn_q\.weight is Q4_K: .*runs Q4_1, Q8_0"):
        block_tensor(read_gguf(path), record)
    with pytest.raises(UnsupportedWeights, match="Q4_K"):
        gguf_twin(model, path)


def test_a_damaged_file_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 7)
    with pytest.raises(ModelLoadError, match="could not read .* as a GGUF file"):
        read_gguf(bad)


# ---------------------------------------------------------------- the chat target's own file

@needs_cc
def test_the_chat_targets_int4_path_is_its_gguf_and_greedy_speculation_equals_plain():
    from engine.models.presets import PRESETS
    from engine.run import encode_prompt, load_preset

    pair = load_preset("chat", device="cpu", target_weights=WEIGHTS_INT4)
    target = pair.target
    assert target.describe_weights()["tensor_types"] == {"Q4_1": 210, "Q8_0": 1}  # the output layer is Q8_0
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.29.mlp.down_proj", "lm_head"):
        layer = target.runner.get_submodule(name)  # every row, q's in the rotary order
        decoded = dequantize(BlockTensor(layer.gguf_name, layer.kind, layer.out_features, layer.in_features, layer.blocks))
        assert torch.equal(decoded, target.model.get_submodule(name).weight), name
    k_proj = target.runner.get_submodule("model.layers.3.self_attn.k_proj")
    assert torch.equal(k_proj(torch.eye(576)).T, target.model.get_submodule("model.layers.3.self_attn.k_proj").weight)
    preset = PRESETS["chat"]
    prompt = encode_prompt(target.tokenizer, preset.example_prompt, preset.use_chat_template)
    s = SpecSettings(k=4, temperature=0, max_new_tokens=16)
    records = list(speculative_generate(pair, prompt, s))
    spec = [t for r in records for t in r["committed_token_ids"]]
    assert spec[:16] == target_generate(target, prompt, s, pair.eos_ids)
    assert sum(r["num_accepted"] for r in records) > 0


# ---------------------------------------------------------------- what a trace records

@needs_cc
def test_a_trace_says_which_weights_its_target_ran_and_a_false_record_is_refused(tmp_path):
    import json

    from engine.run import run_to_trace
    from engine.stats.report import format_stats
    from engine.trace.format import TraceError, load_trace

    target = tiny_target(tmp_path)
    target.use_weights(WEIGHTS_INT4)
    pair = Pair(target, wrap_model("tiny-draft", tiny_llama(1001, 1, 16), tiny_tokenizer()), set())
    out = tmp_path / "int4.jsonl"
    run_to_trace(pair, "the cat sat", SpecSettings(k=2, max_new_tokens=6, seed=1), out, RunMode(calibrate=True))
    trace = load_trace(out)
    assert trace.header["target_weights"]["path"] == WEIGHTS_INT4
    assert "target" not in trace.header["linear_paths"] and "draft" in trace.header["linear_paths"]
    assert "TARGET WEIGHTS: int4: the blocks of tiny.gguf as stored (14 Q4_1, 1 Q8_0 linear layers" in format_stats(trace)
    lines = out.read_text().splitlines()
    for bad, field in (({"path": "int8"}, "target_weights.path"),
                       ({**trace.header["target_weights"], "tensor_types": {"Q6_K": 1}}, "target_weights.tensor_types")):
        out.write_text("\n".join([json.dumps({**trace.header, "target_weights": bad}), *lines[1:]]) + "\n")
        with pytest.raises(TraceError, match=field.replace(".", r"\.")):
            load_trace(out)
    older = {k: v for k, v in trace.header.items() if k != "target_weights"}  # traces before the field: as loaded
    out.write_text("\n".join([json.dumps(older), *lines[1:]]) + "\n")
    assert "TARGET WEIGHTS: the model as loaded" in format_stats(load_trace(out))


def test_the_command_line_refuses_int4_for_a_target_without_a_gguf_file(tmp_path, capsys):
    from engine.cli import main
    from tests.tiny import save_tiny, tiny_pair

    target, draft = save_tiny(tiny_pair(), tmp_path)
    common = ["run", "--prompt", "the cat", "--target", target, "--draft", draft, "--out", str(tmp_path / "t.jsonl"),
              "--target-weights", "int4"]
    assert main([*common, "--device", "cpu"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: int4 target weights come from a GGUF file")
