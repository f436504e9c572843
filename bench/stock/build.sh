#!/usr/bin/env bash
# Builds bin/otelcol-stock, the stock baseline of `make bench`, from
# bench/stock/builder-config.yaml with ocb v0.161.0 (the release whose
# tail_sampling resolves; see the config). Does nothing when the binary is
# newer than the config and this script, like `make build`.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
GO=${GO:-go}
OCB_VERSION=v0.161.0
OCB=$ROOT/bin/ocb-$OCB_VERSION
OUT=$ROOT/bin/otelcol-stock

if [[ -x $OUT && $OUT -nt $HERE/builder-config.yaml && $OUT -nt $HERE/build.sh ]]; then
  echo "bin/otelcol-stock is up to date" >&2
  exit 0
fi
if [[ ! -x $OCB ]]; then
  mkdir -p "$ROOT/bin/.ocb-stock"
  GOBIN=$ROOT/bin/.ocb-stock $GO install go.opentelemetry.io/collector/cmd/builder@$OCB_VERSION
  mv "$ROOT/bin/.ocb-stock/builder" "$OCB"
  rmdir "$ROOT/bin/.ocb-stock"
fi
cd "$HERE"
"$OCB" --config builder-config.yaml --skip-compilation
cd _build
CGO_ENABLED=0 $GO build -trimpath -ldflags='-s -w' -o "$OUT" .
