"""llama.cpp's logits at every position of a token sequence, for bench/int4_agreement.py --llama-python.

Runs in the Python of llama-cpp-python's own environment (bench/build_llama_cpp.sh), like bench/llama_anchor.py,
and imports neither torch nor the engine:

    VENV/bin/python bench/llama_logits.py MODEL.gguf THREADS IDS_JSON OUT.npy

writes a (len(ids), vocabulary) float32 array: llama.cpp's logits for the next token after each position.
"""
import json
import sys

import numpy as np


def main() -> int:
    import llama_cpp

    path, threads, ids, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    llm = llama_cpp.Llama(model_path=path, n_ctx=max(512, len(ids) + 1), n_threads=threads, logits_all=True,
                          verbose=False)
    llm.eval(ids)
    np.save(out, np.asarray(llm.scores[:len(ids)], dtype=np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
