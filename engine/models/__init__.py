"""One model on its own: loading it, the shipped presets, the device it runs on, its CPU linear
layers, and turning its logits into the distributions both models are tested with.

- loading.py: `load_model`, `LoadedModel` (one forward against a cache), tokenizer checks.
- errors.py: `ModelLoadError` and `TokenizerMismatchError` (a leaf: the GGUF modules raise them too).
- presets.py: the offline model pairs shipped under assets/models.
- device.py: device and dtype choice, and `timed`, the one way the project times work.
- cpu_linear.py: pre-packed oneDNN linear layers for few-row CPU forwards.
- gguf_blocks.py: a GGUF file's Q4_1 / Q8_0 blocks as stored, and their reference decoder.
- kernel_build.py: compiling the engine's C kernels once per machine into the cache folder, loading them with ctypes,
  and the C++ operators (f32_rows_op.cpp, gguf_op.cpp) compiled graphs call them through.
- gguf_kernel.py (+ gguf_kernel.c): the C kernel multiplying float32 rows (or rows rounded to 8 bits) by those
  blocks, built once per machine.
- f32_rows_kernel.py (+ .c): a float32 C kernel reading each weight (float32, or bfloat16 widened as it is read)
  once for a verify's 1-8 rows: the rows path.
- gguf_linear.py: the int4 target path, a twin whose linear layers run the file's blocks.
- linear_paths.py: which linear path (as loaded, packed or rows), and which variant of the rows kernel, runs each
  width, measured per machine, cached on disk.
- machine.py: the CPU model, its vector features, threads and load, as measurements record them.
- measure_cache.py: the on-disk file those per-machine measurements are kept in.
- llama.py: the engine's own Llama-family decoder on a Hugging Face model's weights (--decoder own).
- sampling.py: warping (temperature, top-k, top-p), drawing, and the residual.

May import: engine.config and engine.trace.
"""
