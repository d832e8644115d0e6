"""One-off tools: training the shipped models, sampling distillation data, regenerating the bundled
traces and the teaching pages' stored results. Each runs from the repository root as a module,
e.g. `python -m scripts.make_example_traces` (distill_chat_draft_gpu.sh calls them that way);
test.sh lints and runs the test suite.

A script may import engine and its siblings (`from scripts.chat_prompts import ...`). It imports
app only to write what the app reads (scripts/make_teaching_results.py stores the teaching pages'
results in the app's own format).
"""
