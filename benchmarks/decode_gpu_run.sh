#!/usr/bin/env bash
# On the GPU machine (the `run` device tool), from the repo root: issue 31 items 4 and 2, decode steps
# and prefills on the CUDA and WebGPU EPs (decode_gpu.py) and GPT-Neo's padded rows on CUDA
# (gpt_neo_cuda.py), after benchmarks/cuda_gpu_run.sh's two-piece install of onnxruntime-gpu 1.31.1.
#   bash benchmarks/cuda_gpu_run.sh piece            # call 1: carry .whl/ortp1 .whl/ep .gl
#   bash benchmarks/decode_gpu_run.sh                # call 2, machine warm: carry .whl/ortp2 .whl/bundle
# .whl/bundle/decode_run.tar.xz holds cuda_run/dgm (decode_gpu.py make) and cuda_run/gneo (gpt_neo_cuda.py make).
set -uo pipefail
export PYTHONUNBUFFERED=1
bash benchmarks/cuda_gpu_run.sh install || exit $?
export PYTHONPATH=/tmp/ortgpu
timeout "${CUDA_S:-230}" python3 benchmarks/decode_gpu.py run /tmp/cuda_run/dgm --out "$OUT" --ep cuda \
  --budget-s "$(( ${CUDA_S:-230} - 40 ))" --repeats "${REPEATS:-10}" > "$OUT/decode_cuda.log" 2>&1; echo "decode cuda rc=$?"
timeout 60 python3 benchmarks/gpt_neo_cuda.py run /tmp/cuda_run/gneo --out "$OUT" > "$OUT/gpt_neo.log" 2>&1; echo "gpt-neo rc=$?"
for f in /tmp/stash/.gl/*.deb /tmp/stash/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --target /tmp/epw /tmp/stash/ep/onnxruntime_ep_webgpu-*.whl
VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json \
__EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json PYTHONPATH=/tmp/epw:/tmp/ortgpu \
  timeout "${WEBGPU_S:-170}" python3 benchmarks/decode_gpu.py run /tmp/cuda_run/dgm --out "$OUT" --ep webgpu \
  --budget-s "$(( ${WEBGPU_S:-170} - 30 ))" --repeats "${REPEATS:-10}" > "$OUT/decode_webgpu.log" 2>&1; echo "decode webgpu rc=$?"
for f in "$OUT"/*.log; do echo "== $f"; tail -n 4 "$f"; done
exit 0
