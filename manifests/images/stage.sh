#!/usr/bin/env bash
# Builds the binaries and plugins the images hold (optimised) and copies them into DIR, the
# build context of krane.Containerfile, krane-ctrl.Containerfile and sentinel.Containerfile:
#   DIR/bin/{krane,krane-plugin-host,krane-ctrl,krane-sentinel}
#   DIR/plugins/lib{deployment,sentinel,cilium}.so
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
out="$1"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
targets=(//agent:krane //agent:krane-plugin-host //controlplane:krane-ctrl
  //plugins/deployment:libdeployment.so //plugins/sentinel:libsentinel.so
  //plugins/cilium:libcilium.so //plugins/sentinel:krane-sentinel)
bazel build -c opt "${targets[@]}"
bin="$(bazel info -c opt bazel-bin)"
mkdir -p "$out/bin" "$out/plugins"
cp -fL "$bin/agent/krane" "$bin/agent/krane-plugin-host" "$bin/controlplane/krane-ctrl" \
  "$bin/plugins/sentinel/krane-sentinel" "$out/bin/"
cp -fL "$bin/plugins/deployment/libdeployment.so" "$bin/plugins/sentinel/libsentinel.so" \
  "$bin/plugins/cilium/libcilium.so" "$out/plugins/"
echo "staged in $out:"
ls -l "$out/bin" "$out/plugins"
