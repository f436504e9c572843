#!/usr/bin/env bash
# Builds llama.cpp's llama-server for the CPU, once per version and build
# options, into a cache folder, and prints that folder. Its source is the
# llama.cpp release that the npm package node-llama-cpp ships (its llama/
# folder holds a git bundle of a tagged release), so one pinned, checksummed
# package from the npm registry is all it fetches. The folder holds:
#
#   bin/llama-server   static, no GPU backend, no curl, no SSL, no web UI
#   gguf-py/           the tree's GGUF writer (internal/harness/llamacpp/make_model.py)
#   models/            the vocab-only GGUFs the tree ships (the test model's tokenizer)
#   release            the llama.cpp tag and commit it was built from
#
#   tools/llama-server.sh           fetch and build when not cached (about 10 min on 2 cores)
#   tools/llama-server.sh --cached  print the folder when it is built, else exit 1 (fetches nothing)
#
# Needs npm, git, cmake and a C++ compiler (Debian: npm git cmake g++).
# LLAMA_CACHE_DIR moves the cache (default ~/.cache/otelcol-llm/llama.cpp);
# LLAMA_BUILD_JOBS sets make's -j (default 2).
set -euo pipefail

# The one place the version is pinned; the integrity is the registry's
# (npm view node-llama-cpp@VERSION dist.integrity).
NODE_LLAMA_CPP_VERSION=3.22.1
NODE_LLAMA_CPP_INTEGRITY=sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==

# GGML_NATIVE=OFF: a build for any x86-64 with AVX2 rather than for this CPU
# only, so that a cache copied between machines still runs. The UI options
# keep the build from downloading the web UI. LLAMA_BUILD_IS_DEV=OFF: the
# tree is a release tag, so the version is not labelled -dev.
CMAKE_OPTIONS=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_IS_DEV=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
)

key=$(printf '%s\n' "$NODE_LLAMA_CPP_VERSION" "${CMAKE_OPTIONS[@]}" | sha256sum | cut -c1-12)
cache=${LLAMA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otelcol-llm/llama.cpp}
dir=$cache/node-llama-cpp-$NODE_LLAMA_CPP_VERSION-$key

built() { [ -x "$dir/bin/llama-server" ] && [ -f "$dir/release" ]; }

if [ "${1:-}" = --cached ]; then
  built && echo "$dir" && exit 0
  echo "llama-server is not built in $dir: run tools/llama-server.sh (make llama-server)" >&2
  exit 1
fi

missing=""
for tool in npm:npm node:nodejs git:git cmake:cmake c++:g++; do
  command -v "${tool%%:*}" >/dev/null || missing="$missing ${tool##*:}"
done
if [ -n "$missing" ]; then
  echo "tools/llama-server.sh needs:$missing (apt-get install$missing)" >&2
  exit 1
fi

mkdir -p "$cache"
# One build at a time per folder: make and a test may ask together.
exec 9>"$dir.lock"
flock 9
if built; then
  echo "$dir"
  exit 0
fi

work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

(cd "$work" && npm pack --silent "node-llama-cpp@$NODE_LLAMA_CPP_VERSION" >/dev/null)
tarball=$work/node-llama-cpp-$NODE_LLAMA_CPP_VERSION.tgz
got=sha512-$(node -e 'process.stdout.write(require("crypto").createHash("sha512").update(require("fs").readFileSync(process.argv[1])).digest("base64"))' "$tarball")
if [ "$got" != "$NODE_LLAMA_CPP_INTEGRITY" ]; then
  echo "node-llama-cpp-$NODE_LLAMA_CPP_VERSION.tgz: integrity $got, want $NODE_LLAMA_CPP_INTEGRITY" >&2
  exit 1
fi
tar -xzf "$tarball" -C "$work" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
tag=$(node -e 'process.stdout.write(require(process.argv[1]).tag)' "$work/package/llama/llama.cpp.info.json")

# The bundle holds the release as one commit; its head is the tag's tree.
git -c advice.detachedHead=false clone -q "$work/package/llama/gitRelease.bundle" "$work/src"
commit=$(git -C "$work/src" rev-parse HEAD)
echo "llama.cpp $tag ($commit) from node-llama-cpp $NODE_LLAMA_CPP_VERSION: building llama-server into $dir" >&2

cmake -S "$work/src" -B "$work/build" "${CMAKE_OPTIONS[@]}" >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "${LLAMA_BUILD_JOBS:-2}" >"$work/build.log" 2>&1 || { tail -50 "$work/build.log" >&2; exit 1; }

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/models"
cp -r "$work/src/gguf-py" "$dir/gguf-py"
cp "$work/src"/models/ggml-vocab-*.gguf "$dir/models/"
cp "$work/build/bin/llama-server" "$dir/bin/llama-server"
# Last: its presence says the folder is complete.
echo "$tag $commit" >"$dir/release"
echo "llama-server built in $(($(date +%s) - start)) s" >&2
echo "$dir"
