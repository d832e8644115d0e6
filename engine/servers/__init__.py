"""Speculative-decoding metrics of production servers, read and explained in this project's terms.

- server_metrics.py: ServerMetrics, the one record every server-wide reader yields; ServerRequest and
  ServerRequests, one request's counts and a file of them; NothingDrafted, what a rate over zero
  drafts is (never 0); the checks and limits on untrusted input that all readers share.
- prometheus.py: Prometheus text (vLLM's counters, SGLang's gauges), parsed with
  prometheus_client's parser, each series kept; two scrapes of one run of one server give the
  counts of the time between (a pair that is not one run is refused).
- vllm.py: vLLM's counters, its offline `llm.get_metrics()` dump as JSON, and its log lines.
- sglang.py: SGLang's /server_info JSON and its per-request meta_info.
- tensorrt.py: TensorRT-LLM's /metrics JSON (iteration stats with specDecodingStats).
- per_request.py: per-request metrics in each response: vLLM's metrics.speculative_decoding
  (--per-request-spec-decode-metrics summary|detailed), SGLang's meta_info and
  sglext.spec_tokens_details; one ServerRequest per request, a user's "category" kept.
- request_checks.py: the checks a per-request record passes (types, counts, histogram length
  against K, sums against the counts, rates against the counts), each refusal one line.
- request_stats.py: per-request records in a workload's statistics shape (per request, per
  category, overall: rates, histogram, conditional acceptance by position), what a trace of
  ours would add, and the requests added up as one ServerMetrics for explain.py.
- read.py: which reader an input needs, told from its content.
- explain.py: a record in our terms (alpha, predicted tokens per cycle, speedups, the K advisor,
  what limits the server), computed with engine/stats/analysis.py's functions.
- export.py: the other direction, a trace's acceptance under vLLM's Prometheus names.
- launch.py: a live vLLM started from its own environment (scripts/vllm_env.sh) on 127.0.0.1,
  ready when /health answers, stopped by its process id; HTTP only, vllm is never imported here.
- http_client.py: GET and POST of JSON to a live server (urllib only): timeout, retries on
  connection errors and 5xx (never 4xx), answers capped; ClientError names the URL in one line.
- server_info.py: a live server's kind, version, model and speculative configuration, from
  /version, /v1/models and /server_info, merged with what the user says it was started with.
- answer_checks.py: one answers.jsonl line of a server workload, checked for meaning.
- server_workload.py: the server workload folder (manifest.json, answers.jsonl, two /metrics
  scrapes): written atomically, read back as untrusted input (ServerWorkload).
- client.py: `python -m engine client`'s run: prompts sent on threads, answers checked and kept,
  /metrics scraped before and after, resumable.
- report.py: the explanation, and the per-request report, as plain text for `python -m engine metrics`.

May import: engine.stats, engine.trace, prometheus_client and the standard library. Never
torch or streamlit: the app's page and the command line both read these modules.
"""
