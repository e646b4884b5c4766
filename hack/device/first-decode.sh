#!/usr/bin/env bash
# The crash site on a real GPU: one prefill and one decode server of SGLang 0.5.16, PD-disaggregated on one GPU,
# DSPARK on a tiny DeepSeek-V4 with random weights, run as shipped and then with the fix; records the first decoded
# tokens of one request (or the decode server's error) per run.
#
# Run by hand on a GPU machine; it is not part of `make test` (no GPU there). docs/decode-path.md ("On a GPU")
# says what it needs, what it shows, and that it has not been run yet.
#
#   bash hack/device/first-decode.sh            # results under $OUT (default /tmp/first-decode)
#
# Needs, on PATH or in $PYTHON: SGLang 0.5.16 installed for CUDA with its kernels (the lmsysorg/sglang:v0.5.16-cu129
# image has it), sglang-router, and the mooncake transfer engine (mooncake_tcp needs no RDMA NIC). No network.
set -euo pipefail

PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/first-decode}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
PREFILL_PORT=30100 DECODE_PORT=30200 ROUTER_PORT=30300 BOOTSTRAP_PORT=8998
START_TIMEOUT=${START_TIMEOUT:-900}
PROMPT='[11, 12, 13, 14, 15, 16, 17, 18]'
mkdir -p "$OUT"
log() { printf 'first-decode: %s\n' "$*" >&2; }
pids=()
stop_all() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop_all EXIT

version=$("$PYTHON" -c 'import sglang; print(sglang.__version__)')
[[ $version == 0.5.16 ]] || { log "error: $PYTHON has sglang $version, this script needs 0.5.16"; exit 2; }
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || { log "error: torch sees no GPU"; exit 2; }
"$PYTHON" "$REPO/hack/device/tiny_dsv4.py" "$WORK/model" >/dev/null
"$PYTHON" -m pip install --quiet --no-deps --no-build-isolation --target "$WORK/pdfix" "$REPO/images/sglang-pd/pdfix"

common=(--model-path "$WORK/model" --load-format dummy --trust-remote-code --skip-tokenizer-init
        --tp-size 1 --base-gpu-id 0 --mem-fraction-static 0.35 --disable-cuda-graph
        --speculative-algorithm DSPARK --disaggregation-transfer-backend mooncake_tcp --host 127.0.0.1)

wait_healthy() {  # url pid logfile
    local deadline=$(( $(date +%s) + START_TIMEOUT ))
    until curl -fsS "$1/health" >/dev/null 2>&1; do
        kill -0 "$2" 2>/dev/null || { log "server exited: $3"; return 1; }
        (( $(date +%s) < deadline )) || { log "not healthy after ${START_TIMEOUT}s: $3"; return 1; }
        sleep 5
    done
}

run() {  # mode: as-shipped | fixed
    local mode=$1 pythonpath=${PYTHONPATH:-} dir=$OUT/$1
    mkdir -p "$dir"
    [[ $mode == fixed ]] && pythonpath=$WORK/pdfix${pythonpath:+:$pythonpath}
    PYTHONPATH=$pythonpath "$PYTHON" -c 'from sglang.srt.plugins import load_plugins; load_plugins()' \
        > "$dir/plugins.log" 2>&1 || true
    PYTHONPATH=$pythonpath "$PYTHON" -m sglang.launch_server "${common[@]}" --port $PREFILL_PORT \
        --disaggregation-mode prefill --disaggregation-bootstrap-port $BOOTSTRAP_PORT > "$dir/prefill.log" 2>&1 &
    pids+=($!); local prefill=$!
    PYTHONPATH=$pythonpath "$PYTHON" -m sglang.launch_server "${common[@]}" --port $DECODE_PORT \
        --disaggregation-mode decode > "$dir/decode.log" 2>&1 &
    pids+=($!); local decode=$!
    local served=false
    if wait_healthy "http://127.0.0.1:$PREFILL_PORT" $prefill "$dir/prefill.log" \
        && wait_healthy "http://127.0.0.1:$DECODE_PORT" $decode "$dir/decode.log"; then
        "$PYTHON" -m sglang_router.launch_router --pd-disaggregation --host 127.0.0.1 --port $ROUTER_PORT \
            --prefill "http://127.0.0.1:$PREFILL_PORT" $BOOTSTRAP_PORT --decode "http://127.0.0.1:$DECODE_PORT" \
            > "$dir/router.log" 2>&1 &
        pids+=($!)
        wait_healthy "http://127.0.0.1:$ROUTER_PORT" $! "$dir/router.log" && served=true
    fi
    if $served; then
        curl -sS -m 300 "http://127.0.0.1:$ROUTER_PORT/generate" -H 'content-type: application/json' \
            -d "{\"input_ids\": $PROMPT, \"sampling_params\": {\"max_new_tokens\": 8, \"temperature\": 0}}" \
            > "$dir/response.json" 2> "$dir/curl.err" || true
    fi
    sleep 2
    stop_all
    MODE=$mode DIR=$dir SERVED=$served "$PYTHON" - <<'PY'
import json, os
d = os.environ["DIR"]
def text(name):
    try:
        return open(os.path.join(d, name), errors="replace").read()
    except FileNotFoundError:
        return ""
try:
    response = json.loads(text("response.json") or "null")
except json.JSONDecodeError:
    response = {"unparsed": text("response.json")[-2000:]}
crash = "'NoneType' object has no attribute 'prepare_for_decode'"
summary = {
    "mode": os.environ["MODE"],
    "served": os.environ["SERVED"] == "true",
    "firstTokens": response.get("output_ids") if isinstance(response, dict) else None,
    "response": response,
    "decodeCrashedAtTheFieldSite": crash in text("decode.log"),
    "decodeLogTail": text("decode.log")[-3000:],
    "plugins": text("plugins.log")[-1000:],
}
json.dump(summary, open(os.path.join(d, "summary.json"), "w"), indent=1)
print(json.dumps({k: summary[k] for k in ("mode", "served", "firstTokens", "decodeCrashedAtTheFieldSite")}))
PY
}

log "sglang $version; model config and the fix under $WORK; results under $OUT"
run as-shipped
run fixed
