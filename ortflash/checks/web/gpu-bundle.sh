#!/usr/bin/env bash
# Pack what web-check needs onto a Linux x64 machine that has neither Node.js nor a package
# registry (the GPU machine): this machine's `node`, onnxruntime-node (the Linux x64 binding
# only), onnxruntime-common, onnxruntime-web's Node build and its wasm, and the Vulkan loader.
#
#   ortflash/checks/web/gpu-bundle.sh -> ortflash/checks/web/node_modules/.gpu-bundle.tar.xz (about 40 MB; ignored by git)
#
# There, from the repository root:
#   tar xJf ortflash/checks/web/node_modules/.gpu-bundle.tar.xz -C ortflash/checks/web/node_modules
#   export PATH=$PWD/ortflash/checks/web/node_modules/.gpu/bin:$PATH
#   ldconfig -p | grep -q libvulkan.so.1 || export LD_LIBRARY_PATH=$PWD/ortflash/checks/web/node_modules/.gpu/lib
#   node ortflash/checks/web/run.mjs --info
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -f node_modules/onnxruntime-node/package.json ] || [ ! -f node_modules/onnxruntime-web/package.json ]; then
  ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
nm=node_modules
mkdir -p "$stage/onnxruntime-node/bin/napi-v6/linux" "$stage/onnxruntime-web/dist" "$stage/.gpu/bin" "$stage/.gpu/lib"
cp -r "$nm/onnxruntime-common" "$stage/"
cp -r "$nm/onnxruntime-node/package.json" "$nm/onnxruntime-node/dist" "$stage/onnxruntime-node/"
cp -r "$nm/onnxruntime-node/bin/napi-v6/linux/x64" "$stage/onnxruntime-node/bin/napi-v6/linux/"
cp "$nm/onnxruntime-web/package.json" "$stage/onnxruntime-web/"
cp "$nm"/onnxruntime-web/dist/ort.node.min.mjs "$nm"/onnxruntime-web/dist/ort-wasm-simd-threaded.{mjs,wasm} "$stage/onnxruntime-web/dist/"
cp "$(command -v node)" "$stage/.gpu/bin/node"
vulkan=$(ldconfig -p | awk '/libvulkan\.so\.1 .*x86-64/ {print $NF; exit}')
if [ -n "$vulkan" ]; then cp -L "$vulkan" "$stage/.gpu/lib/libvulkan.so.1"; fi
XZ_OPT=${XZ_OPT:--T0} tar cJf "$nm/.gpu-bundle.tar.xz" -C "$stage" .
echo "wrote ortflash/checks/web/$nm/.gpu-bundle.tar.xz ($(du -h "$nm/.gpu-bundle.tar.xz" | cut -f1))"
