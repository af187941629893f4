#!/usr/bin/env bash
# On the GPU machine (the `run` device tool, carry: .whl/ep .gl build/webgpu_run), from the repo root:
# ONNX Runtime's WebGPU plugin EP (stock onnxruntime + onnxruntime-ep-webgpu, /work/shared/GPU.md)
# on the capability probe's models, the defect reproductions and the lowered zoo. Writes under $OUT.
#   bash benchmarks/webgpu_gpu_run.sh caps|zoo|defects|wgsl-tests|attention|outside ...
# outside: benchmarks/webgpu_outside.py's held-out exports (make them into build/webgpu_run/wout here;
# carry .whl/ep .gl build/webgpu_run/wout; OUTSIDE_S seconds, default 480). stacks: crossover_webgpu.py's
# 12-head stacks (its make step into build/webgpu_run/xwebgpu; STACKS_S seconds, default 200).
# wgsl-tests: tests/test_wgsl*.py on the GPU; attention: benchmarks/gpu_attention.py with the
# arguments in $GPU_ATTENTION_ARGS (carry .whl .gl; wgpu goes to /tmp/site, ORT's plugin EP to /tmp/epw).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --target /tmp/epw .whl/ep/onnxruntime-*.whl .whl/ep/onnxruntime_ep_webgpu-*.whl
export PYTHONPATH=/tmp/epw VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json \
  __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 - <<'PY' | tee -a "$OUT/device.txt"
import onnxruntime as ort, onnxruntime_ep_webgpu as wep
ort.register_execution_provider_library("webgpu", wep.get_library_path())
print("onnxruntime", ort.__version__, ort.__file__, "ep", wep.get_ep_name(), getattr(wep, "__version__", "?"))
print([(d.ep_name, d.device.type, dict(d.ep_metadata)) for d in ort.get_ep_devices()])
PY
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .whl/ext/*.whl
WGSL_PATH=/tmp/site:$PWD
for what in "$@"; do
  case $what in
    wgsl-tests) PYTHONPATH=$WGSL_PATH timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_wgsl.py tests/test_wgsl_resident.py tests/test_wgsl_tuner.py > "$OUT/wgsl_tests.log" 2>&1; echo "wgsl-tests rc=$?" ;;
    attention) PYTHONPATH=$WGSL_PATH timeout 540 python3 benchmarks/gpu_attention.py --out-dir "$OUT" ${GPU_ATTENTION_ARGS:-} > "$OUT/attention.log" 2>&1; echo "attention rc=$?" ;;
    caps) timeout 420 python3 benchmarks/webgpu_capabilities.py run build/webgpu_run/caps --out "$OUT/caps" > "$OUT/caps.log" 2>&1; echo "caps rc=$?" ;;
    zoo) for z in build/webgpu_run/zoo*; do  # zoo, zoo2, ...: webgpu_zoo.py make folders (--only picks their models)
           timeout 420 python3 benchmarks/webgpu_zoo.py run "$z" --out "$OUT/$(basename "$z")" > "$OUT/$(basename "$z").log" 2>&1; echo "$z rc=$?"
         done ;;
    outside) timeout "${OUTSIDE_S:-480}" python3 benchmarks/webgpu_outside.py run build/webgpu_run/wout --out "$OUT" \
        --budget-s "$(( ${OUTSIDE_S:-480} - 90 ))" > "$OUT/outside.log" 2>&1; echo "outside rc=$?" ;;
    stacks) timeout "${STACKS_S:-200}" python3 benchmarks/crossover_webgpu.py run build/webgpu_run/xwebgpu --out "$OUT" \
        --budget-s "$(( ${STACKS_S:-200} - 30 ))" > "$OUT/stacks.log" 2>&1; echo "stacks rc=$?" ;;
    defects) for s in tests/data/webgpu_defects/[a-z]*.py; do case $s in */make_models.py) continue;; esac; echo "=== $s"; timeout 120 python3 "$s" 2>&1 | tail -15; done > "$OUT/defects.log" 2>&1 ;;
  esac
done
for f in "$OUT"/*.log; do tail -n 5 "$f"; done
