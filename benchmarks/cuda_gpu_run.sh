#!/usr/bin/env bash
# On the GPU machine (the `run` device tool), from the repo root: ONNX Runtime's CUDA EP
# (onnxruntime-gpu 1.31.1, its CUDA provider library kept to its sm_90 kernels so that it travels in
# two pieces: benchmarks/README.md, "ONNX Runtime's CUDA EP on the H200") on the capability probe,
# the zoo, the speed blocks and the defect reproductions. Writes under $OUT.
#   bash benchmarks/cuda_gpu_run.sh piece          # call 1 (carry .whl/ortp1 .whl/ep .gl): kept in /tmp
#   bash benchmarks/cuda_gpu_run.sh install caps   # call 2, machine warm (carry .whl/ortp2 .whl/bundle)
#   bash benchmarks/cuda_gpu_run.sh zoo webgpu     # call 3, machine warm (nothing carried)
#   bash benchmarks/cuda_gpu_run.sh install crossover  # or call 2 for the cost table alone (crossover_cuda.py)
#   CAPS_ONLY=REGEX bash benchmarks/cuda_gpu_run.sh install caps forms  # or call 2: the probe's rows REGEX
#     names (cuda_capabilities.py --only) and the lowered blocks as users run them (cuda_forms.py)
#   CUDNN_S=200 bash benchmarks/cuda_gpu_run.sh install cudnn forms  # or call 2: cuda_cudnn_cache.py's models
#     in build/cuda_run/cudnn (the padding blocks at batch 1 and 2), then cuda_forms.py's
#   bash benchmarks/cuda_gpu_run.sh install default-causal  # or call 2: cuda_default_causal.py's stacks (--ep cuda, no --seq-lens)
#   bash benchmarks/cuda_gpu_run.sh install webgpu-zoo  # or call 2 for webgpu_zoo.py's models in build/cuda_run/wzoo
# .whl/bundle holds build/cuda_run (the `make` outputs of cuda_capabilities.py, cuda_zoo.py and
# crossover_webgpu.py) as tar.xz: unpacked to /tmp/cuda_run, which build/cuda_run points at there.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/ortgpu:$PWD
mkdir -p build && rm -rf build/cuda_run && ln -sfn /tmp/cuda_run build/cuda_run
for what in "$@"; do
  case $what in
    piece)
      mkdir -p /tmp/ortpieces /tmp/stash && cp .whl/ortp*/ortgpu_sm90.part.* /tmp/ortpieces/ && ls -la /tmp/ortpieces
      cp -r .whl/ep .gl /tmp/stash/ 2>/dev/null; ls /tmp/stash/*
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      python3 -c "import sys, torch, onnxruntime; print(sys.version.split()[0], 'torch', torch.__version__, torch.version.cuda, 'stock onnxruntime', onnxruntime.__version__)" ;;
    install)
      cp .whl/ortp*/ortgpu_sm90.part.* /tmp/ortpieces/ 2>/dev/null
      mkdir -p /tmp/cuda_run && for b in .whl/bundle/*.tar.xz; do tar xJf "$b" -C /tmp/cuda_run; done
      [ -d /tmp/cuda_run/cuda_run ] && cp -r /tmp/cuda_run/cuda_run/. /tmp/cuda_run/ && rm -rf /tmp/cuda_run/cuda_run
      ls /tmp/cuda_run
      (cd /tmp/ortpieces && cat ortgpu_sm90.part.* > /tmp/ortgpu_sm90.tar.xz)
      (cd /tmp && sha256sum -c "$OLDPWD"/.whl/ortp2/ortgpu_sm90.sha256) || exit 3
      mkdir -p /tmp/ortgpu && tar xJf /tmp/ortgpu_sm90.tar.xz -C /tmp/ortgpu || exit 3
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
      python3 - <<'PY' 2>&1 | tee -a "$OUT/device.txt"
import onnxruntime as ort
ort.preload_dlls()
print("onnxruntime", ort.__version__, ort.__file__, ort.get_available_providers())
import numpy as np, onnx
from onnx import helper, TensorProto
g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "g",
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64, 64]) for n in "ab"],
    [helper.make_tensor_value_info("c", TensorProto.FLOAT, [64, 64])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 9
s = ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider"])
x = np.random.rand(64, 64).astype(np.float32)
print("providers", s.get_providers(), "matmul err", float(np.abs(s.run(None, {"a": x, "b": x})[0] - x @ x).max()))
PY
      grep -q "CUDAExecutionProvider'" "$OUT/device.txt" || exit 4 ;;
    caps) timeout "${CAPS_S:-300}" python3 benchmarks/cuda_capabilities.py run build/cuda_run/caps --out "$OUT" --budget-s "$(( ${CAPS_S:-300} - 40 ))" ${CAPS_ONLY:+--only "$CAPS_ONLY"} > "$OUT/caps.log" 2>&1; echo "caps rc=$?" ;;
    forms) timeout "${FORMS_S:-300}" python3 benchmarks/cuda_forms.py run build/cuda_run/forms --out "$OUT" --budget-s "$(( ${FORMS_S:-300} - 60 ))" > "$OUT/forms.log" 2>&1; echo "forms rc=$?" ;;
    default-causal) timeout "${DEFAULT_S:-200}" python3 benchmarks/cuda_default_causal.py run build/cuda_run/default_causal --out "$OUT" > "$OUT/default_causal.log" 2>&1; echo "default-causal rc=$?" ;;
    zoo) timeout "${ZOO_S:-200}" python3 benchmarks/cuda_zoo.py run "build/cuda_run/${ZOO_DIR:-zoo}" --out "$OUT" --budget-s "$(( ${ZOO_S:-200} - 30 ))" > "$OUT/zoo.log" 2>&1; echo "zoo rc=$?" ;;
    webgpu)  # ORT's WebGPU plugin EP (carry .whl/ep .gl) on the onnxruntime-gpu build installed above
      for f in /tmp/stash/.gl/*.deb /tmp/stash/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done; ldconfig
      python3 -m pip install -q --no-index --no-deps --target /tmp/epw /tmp/stash/ep/onnxruntime_ep_webgpu-*.whl
      { ls -la /tmp/stash /tmp/stash/.gl /usr/local/nvidia/share/vulkan/icd.d; ldconfig -p | grep -i vulkan; } > "$OUT/vulkan.txt" 2>&1
      VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json PYTHONPATH=/tmp/epw:/tmp/ortgpu:$PWD \
        timeout "${WEBGPU_S:-200}" python3 benchmarks/crossover_webgpu.py run build/cuda_run/xwebgpu --out "$OUT" \
        --budget-s "$(( ${WEBGPU_S:-200} - 30 ))" > "$OUT/webgpu.log" 2>&1; echo "webgpu rc=$?" ;;
    cudnn) timeout "${CUDNN_S:-240}" python3 benchmarks/cuda_cudnn_cache.py run build/cuda_run/cudnn --out "$OUT" > "$OUT/cudnn.log" 2>&1; echo "cudnn rc=$?" ;;
    crossover) timeout "${CROSS_S:-300}" python3 benchmarks/crossover_cuda.py run build/cuda_run/xcuda --out "$OUT" --budget-s "$(( ${CROSS_S:-300} - 40 ))" > "$OUT/crossover.log" 2>&1; echo "crossover rc=$?" ;;
    webgpu-zoo)  # the lowered zoo (webgpu_zoo.py make ... build/cuda_run/wzoo) on the WebGPU plugin EP, as the webgpu step runs it
      for f in /tmp/stash/.gl/*.deb /tmp/stash/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done; ldconfig
      python3 -m pip install -q --no-index --no-deps --target /tmp/epw /tmp/stash/ep/onnxruntime_ep_webgpu-*.whl
      VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json PYTHONPATH=/tmp/epw:/tmp/ortgpu:$PWD \
        timeout "${WZOO_S:-300}" python3 benchmarks/webgpu_zoo.py run build/cuda_run/wzoo --out "$OUT/wzoo" > "$OUT/wzoo.log" 2>&1; echo "webgpu-zoo rc=$?" ;;
    defects) for s in tests/data/cuda_defects/[a-z]*.py; do [ -e "$s" ] || continue; echo "=== $s"; timeout 60 python3 "$s" 2>&1 | tail -15; done > "$OUT/defects.log" 2>&1 ;;
  esac
done
for f in "$OUT"/*.log; do [ -e "$f" ] && tail -n 3 "$f"; done
exit 0
