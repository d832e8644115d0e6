"""The llama.cpp anchor of bench/speed.py: plain decoding of a GGUF file with llama-cpp-python.

llama-cpp-python is an optional benchmark dependency, never one of the app's: it is built from
source in a virtual environment of its own (bench/build_llama_cpp.sh says how and with which
flags), and bench/speed.py runs this file with that environment's Python, so nothing of it
enters the project's environment. It imports neither torch nor the engine.

    VENV/bin/python bench/llama_anchor.py MODEL.gguf THREADS

Protocol, one JSON object per line: first it prints {"ready": true, "version", "system_info"};
then for each request {"ids": [...], "max_new_tokens": N, "temperature": T, "seed": S} on stdin it
prints {"tokens": N, "seconds": S}: the time of the prompt's evaluation plus N decoded tokens (no EOS stop),
as bench/speed.py's own methods are timed end to end; N = 0 times the prompt's evaluation alone. Sampling is
llama.cpp's with every filter off (top-k 0, top-p 1, min-p 0, no repetition penalty): greedy at temperature 0.
"""
import json
import sys
import time


def decode(llm, ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> int:
    llm.reset()
    if max_new_tokens == 0:  # the prompt's evaluation alone
        llm.eval(ids)
        return 0
    llm.set_seed(seed)
    made = 0
    for _ in llm.generate(ids, temp=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        made += 1
        if made == max_new_tokens:
            break
    return made


def main() -> int:
    import llama_cpp

    path, threads = sys.argv[1], int(sys.argv[2])
    llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=threads, n_threads_batch=threads,
                          n_batch=512, verbose=False)
    info = llama_cpp.llama_print_system_info()
    print(json.dumps({"ready": True, "version": llama_cpp.__version__,
                      "system_info": info.decode() if isinstance(info, bytes) else str(info)}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        start = time.perf_counter()
        made = decode(llm, req["ids"], req["max_new_tokens"], req["temperature"], req["seed"])
        print(json.dumps({"tokens": made, "seconds": time.perf_counter() - start}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
