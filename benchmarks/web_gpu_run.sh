#!/usr/bin/env bash
# Run on the GPU machine (device tool) from the repo root, carrying gpurun/, .gl/ and
# ortflash/checks/web/node_modules/.gpu-bundle.tar.xz (ortflash/checks/web/gpu-bundle.sh). gpurun/ holds lowered zoo models
# (ortflash optimize models/X.onnx --target contrib|onnx -o gpurun/X.T.onnx) and gpurun/whl/ the wheels
# of onnxruntime-extensions, onnx-ir and wgpu (+cffi, pycparser, rendercanvas, sniffio) for Python 3.12.
# On the GPU machine: node-webgpu (ORT's WebGPU EP through Dawn on Vulkan) and wgsl validate.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --target /tmp/site gpurun/whl/*.whl
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-} PYTHONPATH=/tmp/site:$PWD VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
tar xJf ortflash/checks/web/node_modules/.gpu-bundle.tar.xz -C ortflash/checks/web/node_modules
export PATH=$PWD/ortflash/checks/web/node_modules/.gpu/bin:$PATH
ldconfig -p | grep -q libvulkan.so.1 || export LD_LIBRARY_PATH=$PWD/ortflash/checks/web/node_modules/.gpu/lib
export COLUMNS=200
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
node --version
for m in gpurun/*.onnx; do
  for rt in node-webgpu node-cpu; do
    echo "=== $m $rt"
    timeout 120 python3 -m ortflash web-check "$m" --runtime $rt --seq-len 37 2>&1 | grep -v XDG | tail -6
    echo "rc=$?"
  done
done
for z in bert_sdpa_dynamo llama_sdpa_dynamo whisper_eager_torchscript; do
  echo "=== validate wgsl $z"
  timeout 120 python3 -m ortflash validate models/$z.onnx --backend wgsl --softmax online --seq-len 40 2>&1 | grep -v XDG | tail -4
done
