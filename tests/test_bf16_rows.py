"""The rows kernel on bfloat16 weights (engine/models/f32_rows_kernel.c): the float32 kernel's bits on the widened
weights, rounded once to bfloat16; independent of threads and of the rows beside a row; the same bits through
the C++ operator and in a compiled graph; and, for a bfloat16 model, a linear path the engine measures beside
the model as loaded (oneDNN's packed path takes float32 only, and the trace says so), on which greedy
speculation is greedy plain decoding."""
import shutil

import pytest
import torch
from torch import nn

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.reference import speculative_generate
from engine.models import f32_rows_kernel as rows_kernel
from engine.models import linear_paths
from engine.models.f32_rows_kernel import ISAS, RowsLinear
from engine.models.loading import wrap_model
from engine.stats.paths import path_lines, path_rows
from engine.trace.errors import BrokenInvariant
from engine.trace.header_checks import check_linear_path_curve
from engine.trace.schema import AS_LOADED, PACKED, ROWS
from tests.tiny import noisy_pair

needs_cc = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler for the kernel")
needs_cxx = pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")),
                               reason="no C++ compiler for the native operator")
pytestmark = needs_cc

BF16_ULP = 2.0 ** -7  # a bfloat16 keeps 8 significant bits: neighbours differ by 2^-7 of the value at most


def runnable_isas() -> list[str]:
    best = ISAS[rows_kernel.best_isa()]
    return [name for name, n in ISAS.items() if n <= best]


def float32_twin_isa(isa: str) -> int:
    """The variant whose float32 sums a bfloat16 call reproduces: AVX-512 has no bfloat16 tiles, so it runs AVX2's."""
    return ISAS["avx2"] if isa == "avx512" else ISAS[isa]


@pytest.mark.parametrize("with_bias", [False, True])
def test_bfloat16_weights_give_the_float32_kernel_s_sums_of_their_exact_widening_rounded_once(with_bias):
    gen = torch.Generator().manual_seed(0)
    for isa in runnable_isas():
        for n, k in [(37, 45), (5, 23), (13, 577), (64, 1), (1, 7), (33, 16)]:  # odd N; K off the vector widths
            w = torch.randn(n, k, generator=gen).bfloat16()
            b = torch.randn(n, generator=gen).bfloat16() if with_bias else None
            for m in (1, 2, 3, 5, 8, 9, 17):  # one block of rows, and blocks of 8
                x = torch.randn(m, k, generator=gen).bfloat16()
                got = rows_kernel.linear(x, w, b, ISAS[isa])
                assert got.dtype == torch.bfloat16 and got.shape == (m, n)
                widened = rows_kernel.linear(x.float(), w.float(), None if b is None else b.float(),
                                             float32_twin_isa(isa))
                assert torch.equal(got, widened.bfloat16()), (isa, m, n, k)
                # and torch's own bfloat16 product (other sums, one rounding) within two bfloat16 steps
                exact = nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
                scale = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
                theirs = nn.functional.linear(x, w, b).double()
                assert ((got.double() - exact).abs() <= BF16_ULP * exact.abs() + 1e-5 * scale).all()
                assert ((got.double() - theirs).abs() <= 2 * BF16_ULP * exact.abs() + 2e-5 * scale).all()


@pytest.mark.parametrize("which", [pytest.param("native", marks=needs_cxx), "python"])
def test_a_bfloat16_rows_twin_compiles_to_one_kernel_call_per_layer_with_the_eager_bits(monkeypatch, which):
    if which == "native":
        assert rows_kernel.prepare_compiled(), rows_kernel.NATIVE_MISSING
    else:
        monkeypatch.setattr(rows_kernel, "NATIVE", [None])
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(45, 37), nn.ReLU(), nn.Linear(37, 11, bias=False)).bfloat16()
    twin = rows_kernel.rows_twin(model)
    x = torch.randn(1, 5, 45).bfloat16()
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.inference_mode():
        eager = twin(x)
        assert eager.dtype == torch.bfloat16 and isinstance(twin[0], RowsLinear) and isinstance(twin[2], RowsLinear)
        torch._dynamo.reset()
        assert torch.equal(torch.compile(twin, backend=keep, fullgraph=True)(x), eager)
        calls = [n for n in graphs[0].graph.nodes if "f32_rows_linear" in str(n.target)]
        assert len(calls) == 2
        torch._dynamo.reset()
        assert torch.equal(torch.compile(twin, fullgraph=True)(x), eager)


def bf16_pair(seed: int = 2) -> Pair:
    pair = noisy_pair(seed)
    return Pair(*(wrap_model(m.name, m.model.to(torch.bfloat16), m.tokenizer) for m in (pair.target, pair.draft)),
                pair.eos_ids)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_LINEAR_PATHS", str(tmp_path / "linear-paths.json"))
    return tmp_path


def test_a_bfloat16_model_times_as_loaded_and_rows_and_the_record_says_why_packed_is_absent(cache_dir):
    pair = bf16_pair()
    target = pair.target
    assert linear_paths.applies(target)
    record = linear_paths.settle(target)
    assert set(record["seconds"]) == {AS_LOADED, ROWS}
    assert record["absent"] == {PACKED: linear_paths.PACKED_FLOAT32_ONLY}
    check_linear_path_curve(record, "t", "linear_paths.target")  # what a trace header keeps reads back
    rows = path_rows({"linear_paths": {"target": record}})
    assert [r.packed_s for r in rows] == [None] * linear_paths.WIDTHS and all(r.rows_s > 0 for r in rows)
    assert "packed (the packed path runs float32 weights only)" in path_lines({"linear_paths": {"target": record}})[-1]
    for width, path in target.linear_paths.items():
        runner = target.runner_for(width)
        assert (runner is target.base) if path == AS_LOADED else any(isinstance(m, RowsLinear) for m in runner.modules())


@pytest.mark.parametrize("features, on_rows", [(["avx2"], True), (["avx2", "avx512f", "avx512_bf16"], False),
                                               (["avx2", "avx512f", "amx_tile", "amx_bf16"], False)])
def test_uncalibrated_a_bfloat16_model_runs_the_rows_kernel_where_the_cpu_lacks_bfloat16_instructions(
        monkeypatch, features, on_rows):
    """No packed twin takes bfloat16; where torch would convert every product, the rows kernel is the default."""
    from engine.models import machine
    monkeypatch.setattr(machine, "cpu_features", lambda: features)
    target = bf16_pair().target
    assert target.linear_paths is None and target.bfloat16_on_rows() == on_rows
    assert target.runner is (target.rows_runner if on_rows else target.base)
    assert target.runner_for(3) is target.runner
    float32 = noisy_pair(2).target
    assert not float32.bfloat16_on_rows() and target.runner is not float32.runner


def test_a_curve_must_time_packed_or_say_why_not():
    record = {"widths": [1], "seconds": {AS_LOADED: [2.0], ROWS: [1.0]}, "chosen": {"1": ROWS},
              "machine": {"cpu": "c", "torch": torch.__version__}}
    with pytest.raises(BrokenInvariant, match=r"linear_paths\.target\.seconds"):
        check_linear_path_curve(record, "t", "linear_paths.target")  # packed neither timed nor explained
    check_linear_path_curve({**record, "absent": {PACKED: "float32 only"}}, "t", "linear_paths.target")
    alone = {**record, "seconds": {AS_LOADED: [2.0]}, "chosen": {"1": AS_LOADED},
             "absent": {PACKED: "float32 only", ROWS: "no compiler"}}
    with pytest.raises(BrokenInvariant, match=r"linear_paths\.target\.seconds"):
        check_linear_path_curve(alone, "t", "linear_paths.target")  # one path is no choice: never recorded
    with pytest.raises(BrokenInvariant, match=r"linear_paths\.target\.absent"):
        check_linear_path_curve({**record, "absent": {ROWS: "timed and absent at once"}}, "t", "linear_paths.target")


@pytest.mark.parametrize("decoder", ["hf", "own"])
def test_the_bfloat16_rows_path_follows_the_model_as_loaded_and_speculation_runs_on_it(decoder):
    """In bfloat16 a forward is not width-invariant on either path: attention and norms round a 4-position
    verify's rows differently from 4 one-token steps (0.03 in a logit here, as loaded too), so greedy
    speculation can part from greedy plain decoding at a near-tie, which float32 (1e-6) does not. What the rows
    path owes: its products are row-invariant (above), and its logits follow the model as loaded."""
    pair = bf16_pair()
    for m in (pair.target, pair.draft):
        m.use_decoder(decoder)
        m.linear_paths = {w: ROWS for w in range(1, 200)}  # every width, the prompt's prefill too
    assert any(isinstance(mod, RowsLinear) for mod in pair.target.runner_for(4).modules())
    records = list(speculative_generate(pair, [1, 2, 4, 6, 7], SpecSettings(k=3, temperature=0, max_new_tokens=24)))
    assert sum(r["num_accepted"] for r in records) > 0
    cache, ids = pair.target.new_cache(), [3, 1, 4, 1, 5, 9, 2, 6, 5]
    pair.target.fill(ids[:4], cache)
    rows = pair.target.forward(ids[4:], cache)
    cache.crop(-5)
    pair.target.linear_paths = {5: AS_LOADED}
    loaded = pair.target.forward(ids[4:], cache)
    # Logits of these 32-wide models reach about 3; each bfloat16 rounding moves a value by up to 2^-8 of it,
    # over two layers of a dozen roundings: 0.1 is a few times the 0.03 two widths differ by, far below a
    # wrong tile's O(1).
    assert (rows.float() - loaded.float()).abs().max() < 0.1


def test_the_teaching_bfloat16_copy_runs_its_own_bfloat16_weights_not_the_original_s_twins():
    from engine.teaching.runs import low_precision_copy
    target = noisy_pair(2).target
    target.use_decoder("own")
    target.linear_paths = {w: ROWS for w in range(1, 10)}
    assert target.rows_runner is not None and target.runner is not None  # float32 twins built
    copy = low_precision_copy(target)
    assert copy.decoder == "own" and copy.linear_paths is None
    for width in (1, 3):
        weights = [p for p in copy.runner_for(width).parameters()]
        assert weights and all(p.dtype == torch.bfloat16 for p in weights)
    assert all(p.dtype == torch.float32 for p in target.runner_for(3).parameters())
