"""The other direction: a trace's acceptance under vLLM's Prometheus names, so a dashboard
built for vLLM (its PromQL in vllm/v1/spec_decode/metrics.py) reads this project's runs.

Written with prometheus_client's own exposition code, the way vLLM's /metrics is, so the text
is what a vLLM scrape looks like: `vllm:spec_decode_num_drafts_total{...} 12.0` and so on,
with the labels vLLM puts on them (model_name, engine) and `position` on the per-position one.
"""
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily

from engine.servers import vllm
from engine.trace import Trace, model_name
from engine.trace.format import drafted
from engine.trace.metrics import drafts

HELP = {vllm.DRAFTS: "Number of spec decoding drafts.", vllm.DRAFT_TOKENS: "Number of draft tokens.",
        vllm.ACCEPTED: "Number of accepted tokens.", vllm.PER_POS: "Accepted tokens per draft position.",
        vllm.GENERATED: "Number of generation tokens processed."}


class TraceCollector:
    """A prometheus_client collector holding one trace's counts (they never change)."""

    def __init__(self, trace: Trace):
        self.trace = trace

    def collect(self):
        cycles, k = self.trace.cycles, self.trace.k
        labels = {"model_name": model_name(self.trace.header, "target"), "engine": "0"}
        # A cycle that drafted nothing is no draft to vLLM (engine/trace/metrics.py); its token still counts as generated.
        totals = {vllm.DRAFTS: drafts([drafted(c) for c in cycles]), vllm.DRAFT_TOKENS: sum(drafted(c) for c in cycles),
                  vllm.ACCEPTED: sum(c["num_accepted"] for c in cycles),
                  vllm.GENERATED: sum(len(c["committed_token_ids"]) for c in cycles)}
        for name, value in totals.items():
            family = CounterMetricFamily(name, HELP[name], labels=list(labels))
            family.add_metric(list(labels.values()), value)
            yield family
        per_pos = CounterMetricFamily(vllm.PER_POS, HELP[vllm.PER_POS], labels=[*labels, "position"])
        for i in range(k):  # cycles that accepted position i: vLLM's prefix counting
            per_pos.add_metric([*labels.values(), str(i)], sum(c["num_accepted"] > i for c in cycles))
        yield per_pos


def prometheus_text(trace: Trace) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TraceCollector(trace))
    return generate_latest(registry).decode("utf-8")
