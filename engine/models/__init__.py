"""One model on its own: loading it, the shipped presets, the device it runs on, its CPU linear
layers, and turning its logits into the distributions both models are tested with.

- loading.py: `load_model`, `LoadedModel` (one forward against a cache), tokenizer checks.
- presets.py: the offline model pairs shipped under assets/models.
- device.py: device and dtype choice, and `timed`, the one way the project times work.
- cpu_linear.py: pre-packed oneDNN linear layers for few-row CPU forwards.
- linear_paths.py: which linear path (as loaded or packed) runs each width, measured per machine, cached on disk.
- machine.py: the CPU model, its vector features, threads and load, as measurements record them.
- sampling.py: warping (temperature, top-k, top-p), drawing, and the residual.

May import: engine.config and engine.trace.
"""
