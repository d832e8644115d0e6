"""The float32 rows kernel (engine/models/f32_rows_kernel.c): F.linear's result up to float32 rounding for
1..8 rows (and more, in blocks), shapes with tails, with and without bias, in every variant this CPU runs;
independent of the thread count and of the rows beside a row; one operator under torch.compile; and a
linear path the engine can run: greedy decoding on it is plain greedy decoding as loaded."""
import copy
import shutil

import pytest
import torch
from torch import nn

from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.models import f32_rows_kernel as rows_kernel
from engine.models import linear_paths
from engine.models.f32_rows_kernel import ISAS, VARIANTS, RowsLinear
from engine.stats.paths import path_lines, path_rows
from engine.trace.header_checks import check_linear_path_curve
from engine.trace.schema import AS_LOADED, PACKED, ROWS
from tests.tiny import noisy_pair

needs_cc = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler for the kernel")
pytestmark = needs_cc

U = 2.0 ** -24  # float32 unit roundoff


def error_bound(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """(M, N) bound on |float32 result - exact| for ANY order of the K products' sums and the bias add:
    gamma_(K+1) = (K+1)u / (1 - (K+1)u) times sum |x_k w_k| + |b| (Higham, Accuracy and Stability of
    Numerical Algorithms, 2nd ed., eq. 3.5 / Lemma 3.1). It grows with K, as the kernel's and BLAS's
    different summation orders do; rounding the float64 reference to compare adds nothing that matters."""
    k = x.shape[1] + 1
    scale = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
    return k * U / (1 - k * U) * scale


def runnable_isas() -> list[str]:
    """Every variant this CPU runs: each ISA up to its best, prefetching into L1 or L2."""
    best = ISAS[rows_kernel.best_isa()]
    return [name for name, n in VARIANTS.items() if n & ~rows_kernel.PREFETCH_L2 <= best]


@pytest.mark.parametrize("isa", list(VARIANTS))
@pytest.mark.parametrize("with_bias", [False, True])
def test_rows_kernel_is_f_linear_up_to_float32_rounding(isa, with_bias):
    if isa not in runnable_isas():
        pytest.skip(f"this CPU does not run the {isa} variant")
    gen = torch.Generator().manual_seed(0)
    for n, k in [(37, 45), (5, 23), (13, 577), (64, 1), (1, 7), (33, 16)]:  # odd N; K off the vector widths
        w = torch.randn(n, k, generator=gen)
        b = torch.randn(n, generator=gen) if with_bias else None
        for m in [*range(1, 9), 9, 17]:  # 1..8 rows in one block; 9 and 17 in blocks of 8
            x = torch.randn(m, k, generator=gen)
            got = rows_kernel.linear(x, w, b, VARIANTS[isa]).double()
            exact = nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
            bound = error_bound(x, w, b)
            assert ((got - exact).abs() <= bound).all(), (isa, m, n, k)
            # F.linear is within the same bound of the exact result, so the two within twice it
            assert ((got - nn.functional.linear(x, w, b).double()).abs() <= 2 * bound).all(), (isa, m, n, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_and_two_threads_give_bit_identical_rows_and_a_row_does_not_depend_on_its_neighbours(dtype):
    gen = torch.Generator().manual_seed(1)
    w, b = torch.randn(1001, 300, generator=gen).to(dtype), torch.randn(1001, generator=gen).to(dtype)
    x = torch.randn(8, 300, generator=gen).to(dtype)  # 8 x 1001 x 300 multiply-adds: above SERIAL_BELOW, so threaded
    assert 8 * 1001 * 300 >= rows_kernel.SERIAL_BELOW
    before = torch.get_num_threads()
    try:
        for isa in runnable_isas():
            outs = []
            for threads in (1, 2):
                torch.set_num_threads(threads)
                outs.append(rows_kernel.linear(x, w, b, VARIANTS[isa]))
            assert torch.equal(outs[0], outs[1]), isa
            for m in (1, 3):  # a verify's row equals the one-token step's
                assert torch.equal(rows_kernel.linear(x[:m].contiguous(), w, b, VARIANTS[isa]), outs[0][:m]), isa
            # where the weights are prefetched to changes the speed, never a bit
            l1 = VARIANTS[isa] & ~rows_kernel.PREFETCH_L2
            assert torch.equal(rows_kernel.linear(x, w, b, l1), outs[0]), isa
    finally:
        torch.set_num_threads(before)


def sixteen_bit_weights(n: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """float32 weights that are exact `dtype` numbers, with the awkward ones among them: signed zeros, the
    largest and smallest normals, subnormals (float16's widen to float32 normals), values far apart."""
    w = (torch.randn(n, k, generator=gen) * torch.logspace(-6, 3, k)).to(dtype)
    info = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, info.max, -info.max, info.tiny, -info.tiny, info.tiny / 8, info.smallest_normal / 1024],
                           dtype=torch.float32).to(dtype)
    w.view(-1)[: special.numel()] = special
    return w.float()


@pytest.mark.parametrize("copy_dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_copy_of_exact_weights_gives_the_float32_weights_bits_in_every_variant(copy_dtype):
    gen = torch.Generator().manual_seed(4)
    for n, k in [(37, 45), (13, 577), (33, 16), (5, 3)]:  # K off both vector widths, and K below them
        w32 = sixteen_bit_weights(n, k, copy_dtype, gen)
        copy = rows_kernel.exact_copy16(w32)
        assert copy is not None and copy.dtype == copy_dtype
        assert torch.equal(copy.float(), w32)
        b = torch.randn(n, generator=gen)
        for m in (1, 3, 5, 8, 9):
            x = torch.randn(m, k, generator=gen)
            for isa in runnable_isas():
                want = rows_kernel.linear(x, w32, b, VARIANTS[isa]).view(torch.int32)  # bits: the extremes make inf and NaN
                assert torch.equal(rows_kernel.linear(x, copy, b, VARIANTS[isa]).view(torch.int32), want), (isa, m, n, k)


def test_every_tile_widens_every_finite_float16_exactly():
    """x an identity: y = W^T, so each output is one widened weight (plain C converts in integer code, the
    vector tiles with F16C's instruction)."""
    patterns = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    finite = patterns[torch.isfinite(patterns)].reshape(-1, 16).contiguous()  # (N, 16): 16 weights a row
    for isa in ["scalar", *runnable_isas()]:
        got = rows_kernel.linear(torch.eye(16), finite, None, VARIANTS[isa])  # (16, N)
        assert torch.equal(got.T, finite.float()), isa


def test_exact_copy16_picks_float16_then_bfloat16_and_refuses_float32_weights():
    gen = torch.Generator().manual_seed(5)
    half_exact = torch.randn(64, 32, generator=gen).half().float()
    assert rows_kernel.exact_copy16(half_exact).dtype == torch.float16
    wide = torch.randn(64, 32, generator=gen).bfloat16().float() * 2.0 ** 20  # past float16's range, still bfloat16
    assert rows_kernel.exact_copy16(wide).dtype == torch.bfloat16
    assert rows_kernel.exact_copy16(torch.randn(64, 32, generator=gen)) is None  # float32 training's weights
    late = half_exact.clone()
    late.view(-1)[-1] += 1e-4  # one weight past the probe that no 16-bit type holds
    assert rows_kernel.exact_copy16(late) is None
    assert rows_kernel.exact_copy16(half_exact.bfloat16()) is None  # only float32 layers get a copy


def test_a_rows_twin_reads_the_copy_of_a_16_bit_checkpoint_and_gives_the_same_logits():
    pair = noisy_pair(0, noise=0.3)
    model = pair.draft.model
    exact = copy.deepcopy(model)
    with torch.no_grad():
        for p in exact.parameters():
            p.copy_(p.half().float())  # a checkpoint stored in float16, loaded as float32
    with_copies, without = rows_kernel.rows_twin(exact), rows_kernel.rows_twin(model)
    layers = [m for m in with_copies.modules() if isinstance(m, RowsLinear)]
    assert layers and all(m.copy16 is not None and m.copy16.dtype == torch.float16 for m in layers)
    assert all(m.copy16 is None for m in without.modules() if isinstance(m, RowsLinear))
    assert not any("copy16" in name for name in with_copies.state_dict())  # never saved with the model
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        got = with_copies(input_ids=ids).logits
        for m in layers:  # the same twin on the float32 weights themselves
            m.copy16 = None
        assert torch.equal(got, with_copies(input_ids=ids).logits)


def test_avx2_variant_can_be_forced_on_an_avx512_machine(monkeypatch):
    if rows_kernel.best_isa() != "avx512":
        pytest.skip("needs an AVX-512 CPU to show the AVX2 variant being chosen over the best")
    monkeypatch.setenv(rows_kernel.ISA_ENV, "avx2")
    assert rows_kernel.isa_to_use() == ISAS["avx2"] and rows_kernel.candidate_variants() == ["avx2"]
    twin = rows_kernel.rows_twin(nn.Sequential(nn.Linear(45, 37)))
    layer = twin[0]
    assert isinstance(layer, RowsLinear) and layer.plan.variant(3) == ISAS["avx2"] and layer.plan is twin.rows_plan
    x = torch.randn(3, 45)
    with torch.inference_mode():
        got = layer(x)
    assert ((got.double() - nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())).abs()
            <= error_bound(x, layer.weight, layer.bias)).all()


def test_bad_input_and_variants_are_refused_with_the_reason(monkeypatch):
    w = torch.randn(8, 16)
    with pytest.raises(ValueError, match="of one dtype, float32 or bfloat16"):
        rows_kernel.linear(torch.randn(2, 16, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="of one dtype, float32 or bfloat16"):
        rows_kernel.linear(torch.randn(2, 16, dtype=torch.bfloat16), w)  # bfloat16 activations, float32 weights
    with pytest.raises(ValueError, match="of one dtype, float32 or bfloat16"):
        rows_kernel.linear(torch.randn(2, 16, dtype=torch.float16), w.half())  # no float16 layers, only copies
    with pytest.raises(ValueError, match="of one dtype, float32 or bfloat16"):
        rows_kernel.linear(torch.randn(2, 16), w.half(), torch.randn(8).half())  # a copy's bias stays float32
    with pytest.raises(ValueError, match="contiguous CPU x"):
        rows_kernel.linear(torch.randn(16, 2).T, w)  # not contiguous
    with pytest.raises(ValueError, match="contiguous CPU x"):
        rows_kernel.linear(torch.randn(2, 15), w)
    monkeypatch.setenv(rows_kernel.ISA_ENV, "neon")
    with pytest.raises(ValueError, match="unknown float32 rows variant"):
        rows_kernel.isa_to_use()
    if rows_kernel.best_isa() != "avx512":
        monkeypatch.setenv(rows_kernel.ISA_ENV, "avx512")
        with pytest.raises(ValueError, match="cannot run the avx512 variant"):
            rows_kernel.isa_to_use()


def test_without_a_compiler_the_path_is_absent_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))  # nothing built here yet
    rows_kernel.library.cache_clear()
    try:
        why = rows_kernel.unavailable()
        assert why is not None and "float32 rows path" in why and "still run" in why
        paths, absent = linear_paths.available_paths()
        assert ROWS not in paths and absent == {ROWS: why[:linear_paths.REASON_CHARS]}
    finally:
        monkeypatch.undo()
        rows_kernel.library.cache_clear()
    assert rows_kernel.unavailable() is None


def test_a_curve_without_the_rows_path_still_checks_and_chooses_among_what_it_timed():
    curve = linear_paths.PathCurve({"cpu": "c", "torch": torch.__version__}, "m", [1, 2],
                                   {AS_LOADED: [2.0, 1.0], PACKED: [1.0, 2.0]}, "2026-12-06T00:00:00Z",
                                   absent={ROWS: "no C compiler"})
    assert curve.chosen() == {1: PACKED, 2: AS_LOADED}
    check_linear_path_curve(curve.to_dict(), "t", "linear_paths.target")
    header = {"linear_paths": {"target": curve.to_dict()}}
    assert "rows (no C compiler)" in path_lines(header)[-1]  # the stats report says why the path is missing
    assert [r.rows_s for r in path_rows(header)] == [None, None]
    three = linear_paths.PathCurve(curve.machine, "m", [1, 2], {**curve.seconds, ROWS: [1.0, 0.5]}, curve.measured)
    assert three.chosen() == {1: PACKED, 2: ROWS}  # a tie goes to the earlier path
    check_linear_path_curve(three.to_dict(), "t", "linear_paths.target")


needs_cxx = pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")),
                               reason="no C++ compiler for the native operator")


def use_operator(monkeypatch, which: str) -> None:
    """Compiled graphs call the C++ operator (built here, or the test fails with the reason) or the Python one."""
    if which == "native":
        assert rows_kernel.prepare_compiled(), rows_kernel.NATIVE_MISSING
    else:
        monkeypatch.setattr(rows_kernel, "NATIVE", [None])
        monkeypatch.setattr(rows_kernel, "prepare_compiled", lambda: False)


@pytest.mark.parametrize("which", [pytest.param("native", marks=needs_cxx), "python"])
def test_the_operator_is_one_node_of_one_compiled_graph_with_the_eager_result(monkeypatch, which):
    use_operator(monkeypatch, which)
    torch.manual_seed(3)
    model = rows_kernel.rows_twin(nn.Sequential(nn.Linear(45, 37), nn.ReLU(), nn.Linear(37, 11, bias=False)))
    x = torch.randn(1, 5, 45)
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.inference_mode():
        eager = model(x)
        torch._dynamo.reset()
        assert torch.equal(torch.compile(model, backend=keep, fullgraph=True)(x), eager)
        assert len(graphs) == 1
        calls = [n for n in graphs[0].graph.nodes if "f32_rows_linear" in str(n.target)]
        assert len(calls) == 2  # the kernel, once per layer, as an opaque call
        namespace = "speclab_native." if which == "native" else "speclab."
        assert all(str(n.target).startswith(namespace) for n in calls), [str(n.target) for n in calls]
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)(x)  # inductor: only the relu and reshapes are its own
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("decoder", ["hf", "own"])
def test_greedy_speculation_on_the_rows_path_equals_greedy_plain_decoding_as_loaded(decoder):
    pair = noisy_pair(2)
    for m in (pair.target, pair.draft):
        m.use_decoder(decoder)
        m.linear_paths = {w: ROWS for w in range(1, linear_paths.WIDTHS + 1)}
    assert any(isinstance(mod, RowsLinear) for mod in pair.target.runner_for(4).modules())
    s = SpecSettings(k=3, temperature=0, max_new_tokens=40)
    prompt = [1, 2, 4, 6, 7]
    spec = [t for r in speculative_generate(pair, prompt, s) for t in r["committed_token_ids"]]
    pair.target.linear_paths = {w: AS_LOADED for w in range(1, 200)}  # every width as loaded, prefill too
    assert pair.target.runner_for(1) is pair.target.base
    assert spec == target_generate(pair.target, prompt, s, pair.eos_ids)


def test_the_compiled_fast_path_runs_the_rows_twin_where_it_was_chosen(monkeypatch):
    """Through the Python operator, whose calls into `linear` can be counted; the C++ one runs the same kernel
    on the same arguments (the test above: the same bits)."""
    from engine.cycle import fast as fp
    from tests.test_fast_compile import close_records

    use_operator(monkeypatch, "python")
    pair = noisy_pair(0, noise=0.3)
    for m in (pair.target, pair.draft):
        m.linear_paths = {w: ROWS for w in range(1, linear_paths.WIDTHS + 1)}
    assert pair.target.compiled_module_for(3) is pair.target.rows_runner
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=12, seed=2, cache_layout="static")
    prompt = [1, 2, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14]  # its prefill (width 12) runs packed, not on the kernel
    eager = list(fp.fast_generate(pair, prompt, s, models=fp.FastModels.empty(pair, 2, 40)))
    calls = []
    kernel = rows_kernel.linear
    monkeypatch.setattr(rows_kernel, "linear", lambda *a: calls.append(1) or kernel(*a))  # what the operator runs
    compiled = list(fp.fast_generate(pair, prompt, s, models=fp.FastModels.empty(pair, 2, 40, "compile")))
    assert calls  # only the compiled forwards run widths 1-9 here: their graphs called the kernel, not F.linear
    close_records(compiled, eager)
    pair.target.linear_paths = {3: AS_LOADED}
    assert pair.target.compiled_module_for(3) is pair.target.compiled_module


def test_the_chat_target_on_the_rows_path_keeps_its_logits_and_greedy_speculation_is_plain_greedy_decoding():
    """The real shapes (576 wide, 49,152 outputs, K = 576 and 1536: every tile and tail the kernel has).
    Plain decoding runs the rows path too: as loaded, MKL's different rounding could flip a near-tie."""
    from engine.models.presets import PRESETS
    from engine.run import encode_prompt, load_preset

    pair = load_preset("chat", device="cpu")
    target, preset = pair.target, PRESETS["chat"]
    prompt = encode_prompt(target.tokenizer, preset.example_prompt, preset.use_chat_template)
    cache = target.new_cache()
    target.fill(prompt[:-3], cache)
    target.linear_paths = {3: AS_LOADED}
    loaded = target.forward(prompt[-3:], cache)
    cache.crop(-3)
    target.linear_paths = {3: ROWS}
    rows = target.forward(prompt[-3:], cache)
    # Logits up to ~38 after 30 layers of float32 sums in another order: 2.1e-5 observed (the packed
    # oneDNN path: 6.3e-5, on an Intel Xeon). 1e-3 leaves 15x room for other CPUs and stays far below a
    # real error (a wrong tile or tail moves logits by O(1)).
    assert (rows - loaded).abs().max() < 1e-3
    for m in (pair.target, pair.draft):
        m.linear_paths = {w: ROWS for w in range(1, 200)}  # every width, the prompt's prefill too
    s = SpecSettings(k=4, temperature=0, max_new_tokens=16)
    records = list(speculative_generate(pair, prompt, s))
    spec = [t for r in records for t in r["committed_token_ids"]]
    assert spec[:16] == target_generate(target, prompt, s, pair.eos_ids)
    assert sum(r["num_accepted"] for r in records) > 0


@needs_cxx
def test_the_native_operator_gives_the_kernel_s_bits_and_refuses_what_the_kernel_cannot_take():
    assert rows_kernel.prepare_compiled(), rows_kernel.NATIVE_MISSING
    op = rows_kernel.NATIVE[0]
    torch.manual_seed(4)
    isa = rows_kernel.isa_to_use()
    for m, n, k, bias in ((1, 37, 45, False), (5, 1536, 576, True), (9, 576, 1536, False)):  # tiles, tails, threads
        x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n) if bias else None
        assert torch.equal(op(x, w, b, isa), rows_kernel.linear(x, w, b, isa))
    for m, n, k, bias in ((1, 37, 45, False), (5, 1536, 576, True)):  # bfloat16 weights: the same bits too
        x, w = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
        b = torch.randn(n, dtype=torch.bfloat16) if bias else None
        assert torch.equal(op(x, w, b, isa), rows_kernel.linear(x, w, b, isa))
    for dtype in (torch.float16, torch.bfloat16):  # a float32 layer's 16-bit copy: float32 x, bias and result
        x, w32, b = torch.randn(5, 576), torch.randn(1536, 576).to(dtype).float(), torch.randn(1536)
        got = op(x, w32.to(dtype), b, isa)
        assert got.dtype == torch.float32 and torch.equal(got, rows_kernel.linear(x, w32, b, isa))
    with pytest.raises(RuntimeError, match="contiguous CPU x"):
        op(torch.randn(3, 8).t(), torch.randn(4, 3), None, isa)  # not contiguous
    with pytest.raises(RuntimeError, match="of one dtype, float32 or bfloat16"):
        op(torch.randn(2, 8, dtype=torch.float64), torch.randn(4, 8), None, isa)
    with pytest.raises(RuntimeError, match="of one dtype, float32 or bfloat16"):
        op(torch.randn(2, 8, dtype=torch.float16), torch.randn(4, 8, dtype=torch.float16), None, isa)
    with pytest.raises(RuntimeError, match="bias"):
        op(torch.randn(2, 8), torch.randn(4, 8, dtype=torch.float16), torch.randn(4).half(), isa)
    with pytest.raises(RuntimeError, match="bias"):
        op(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4), isa)
    for bad in (7, 3, -1):  # no such ISA
        with pytest.raises(RuntimeError, match="isa is a variant"):
            op(torch.randn(2, 8), torch.randn(4, 8), None, bad)
    l2 = isa | rows_kernel.PREFETCH_L2
    x, w = torch.randn(5, 576), torch.randn(1536, 576)
    assert torch.equal(op(x, w, None, l2), rows_kernel.linear(x, w, None, isa))  # the prefetch changes no bit


def test_without_a_cxx_compiler_compiled_graphs_keep_the_python_operator(monkeypatch):
    from engine.models import kernel_build

    def no_compiler(*args, **kwargs):
        raise kernel_build.KernelBuildError("the float32 rows operator for compiled graphs needs a C++ compiler")

    monkeypatch.setattr(kernel_build, "build_torch_op", no_compiler)
    monkeypatch.setattr(rows_kernel, "load_torch_op", kernel_build.load_torch_op.__wrapped__)  # uncached
    monkeypatch.setattr(rows_kernel, "NATIVE", [None])
    monkeypatch.setattr(rows_kernel, "NATIVE_MISSING", [])
    rows_kernel.prepare_compiled.cache_clear()
    try:
        assert rows_kernel.prepare_compiled() is False
        assert "needs a C++ compiler" in rows_kernel.NATIVE_MISSING[0] and rows_kernel.NATIVE[0] is None
    finally:
        rows_kernel.prepare_compiled.cache_clear()
