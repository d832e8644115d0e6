#!/usr/bin/env bash
# Builds llama-cpp-python from source into a virtual environment of its own, for bench/speed.py's
# llama.cpp anchor (--llama-python VENV/bin/python). Never the project's .venv: it is a benchmark's
# optional dependency, not the app's.
#
#   bash bench/build_llama_cpp.sh /tmp/llama-venv        # 10-20 minutes on 2 shared cores
#
# Flags, and why:
#   GGML_NATIVE=OFF, GGML_AVX/AVX2/FMA/F16C=ON, GGML_AVX512=OFF: the AVX2 build docs/benchmarks.md measured
#     (84 tok/s on an Intel Xeon), the same code on any x86 CPU of the last decade; a native build
#     would pick AVX-512 on one machine and not another.
#   LLAMA_CPP_NATIVE=1 builds for this CPU instead (GGML_NATIVE=ON: AVX-512 and VNNI where it has them), the
#     build a user compiling llama.cpp on their own machine gets; the results say which build ran.
#   LLAMA_CPP_NATIVE=no-amx builds for this CPU's vector features (AVX-512, VNNI, BF16 where /proc/cpuinfo lists
#     them) with AMX left out. On the 2-core Xeon with AMX under KVM the native build (0.3.36) died with a
#     segmentation fault in its first decode (llama.cpp issue 20824 reports a crash in its AMX matrix product
#     on other AMX machines); this build keeps the AVX-512 repacked kernels and runs there.
#   GGML_BLAS=OFF, GGML_CUDA=OFF: llama.cpp's own CPU kernels, as a CPU user gets them.
#   LLAVA_BUILD=OFF, LLAMA_BUILD_TESTS/EXAMPLES=OFF: only the library the Python binding loads.
set -euo pipefail
VENV=${1:?usage: build_llama_cpp.sh VENV_FOLDER}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
python3 -m venv "$VENV"
LIBRARY_ONLY="-DGGML_BLAS=OFF -DGGML_CUDA=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF $LIBRARY_ONLY"
if [ "${LLAMA_CPP_NATIVE:-0}" = 1 ]; then
  CMAKE_ARGS="-DGGML_NATIVE=ON $LIBRARY_ONLY"
elif [ "${LLAMA_CPP_NATIVE:-0}" = no-amx ]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) \
-DGGML_F16C=$(has f16c) -DGGML_BMI2=$(has bmi2) -DGGML_AVX_VNNI=$(has avx_vnni) -DGGML_AVX512=$(has avx512f) \
-DGGML_AVX512_VBMI=$(has avx512vbmi) -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16) \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF $LIBRARY_ONLY"
fi
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
nice -n 15 "$VENV/bin/pip" install --no-binary llama-cpp-python --no-cache-dir "llama-cpp-python==$VERSION"
"$VENV/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
