#!/usr/bin/env bash
# eppcheck: the llm-d router's endpoint picker on deploy/llm-d's configs,
# against otelcol-llm sidecars, scenario by scenario (README.md).
#
#   deploy/llm-d/eppcheck/run.sh                      # the shipped configs
#   deploy/llm-d/eppcheck/run.sh -without-engines     # before issue 40
#   OUT=dir ROUTER_DIR=path deploy/llm-d/eppcheck/run.sh -scenarios stall,restart
#
# Needs root (each pod is a network namespace; all of them live in one the
# run makes with unshare --net, gone when it ends), Go, and the router's
# source at ROUTER_DIR (default: llm-d-router beside this repository) checked
# out at the commit go.mod requires. About 10 minutes.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
router=$(cd "${ROUTER_DIR:-$root/../llm-d-router}" && pwd)
out=${OUT:-$root/eppcheck-report}

# The commit is the one go.mod requires (its pseudo-version's last part).
want=$(sed -n 's|^require github.com/llm-d/llm-d-router v.*-\([0-9a-f]\{12\}\)$|\1|p' "$here/go.mod")
have=$(git -C "$router" rev-parse HEAD)
if [[ "$have" != "$want"* ]]; then
	echo "run.sh: $router is at $have; check out $want (git -C $router checkout $want)" >&2
	exit 1
fi

cd "$root"
make build
go build -o bin/vllmsim ./cmd/vllmsim
# go.mod replaces the router with ../../../../llm-d-router; another place
# goes through a copy of go.mod.
modfile=()
if [[ "$router" != "$(cd "$root/.." && pwd)/llm-d-router" ]]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	cp "$here/go.mod" "$here/go.sum" "$tmp/"
	(cd "$here" && go mod edit -modfile="$tmp/go.mod" -replace "github.com/llm-d/llm-d-router=$router")
	modfile=(-modfile="$tmp/go.mod")
fi
(cd "$here" && go build "${modfile[@]}" -o "$root/bin/eppcheck" .)

unshare --net bin/eppcheck -out "$out" "$@"
