"""bench/fast_advisor.py on a tiny pair, eager: its figures are the arms it ran and the choices its advisor made
(timings themselves are not checked: tests do not time things)."""
import json

from bench import fast_advisor
from tests.tiny import noisy_pair, save_tiny


def test_the_bench_reports_every_arm_and_each_prompts_advised_k(tmp_path, monkeypatch):
    target, draft = save_tiny(noisy_pair(0, noise=0.05), tmp_path)
    ran = []
    real = fast_advisor.arm_runner

    def spying(pair, forwards, plans, record=True):
        run = real(pair, forwards, plans, record)
        return lambda arm, prompt, ids, s: ran.append((arm, prompt)) or run(arm, prompt, ids, s)
    monkeypatch.setattr(fast_advisor, "arm_runner", spying)
    out = tmp_path / "out"
    assert fast_advisor.main(["--target", target, "--draft", draft, "--capture", "none", "--repeats", "2",
                              "--max-new-tokens", "8", "--prompts", "2", "--temperatures", "0,1",
                              "--out", str(out)]) == 0
    [path] = out.glob("fast-advisor-custom-float32-none-*.json")
    result = json.loads(path.read_text())
    arms = ["plain", "K=1", "K=2", "K=3", "K=4", "advised"]
    assert [t["temperature"] for t in result["temperatures"]] == [0.0, 1.0]
    for t in result["temperatures"]:
        assert list(t["rates"]) == arms and all(len(r) == 2 and min(r) > 0 for r in t["rates"].values())
        assert t["over_plain"]["plain"] == 1.0 and t["best_arm"] in arms[:-1]
        assert list(t["advised"]) == result["prompts"]
        for advice in t["advised"].values():  # K=0 (plain) or the best K, which the pilot could measure
            assert advice["k"] in (0, advice["best_k"]) and 1 <= advice["best_k"] <= 4
            assert (advice["k"] == 0) == (advice["predicted"] < 1.0)
        assert all(c["capture"] == "none" and c["verify_positions"] == [1, 2, 3, 4, 5] for c in t["calibrations"].values())
    # every arm ran on every prompt: one warm-up, then once per repeat and prompt, per temperature
    assert len(ran) == 2 * len(arms) * (1 + 2 * 2)
    text = path.with_suffix(".md").read_text()
    assert all(f"| {arm}" in text for arm in arms) and text.count("### Temperature") == 2
