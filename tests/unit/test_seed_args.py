"""The seed example renders exactly the seed's two `sglang serve` command lines, up to documented differences.

The command lines are the working deployment from the upstream fix's report (../shared/seeds/). The differences
are deliberate and listed in docs/api.md: full flag names, an explicit bootstrap port, one HTTP port for both
pools (the router's service discovery probes a single port).
"""

from __future__ import annotations

import shlex
from typing import Any

from specserving.api.loading import spec_of
from specserving.rendering import render

from .builders import seed

SEED_PREFILL = """
sglang serve --trust-remote-code --model-path /data2/DeepSeek-V4-Flash-DSpark --tp 8 --dp 8
  --mem-fraction-static 0.8 --chunked-prefill-size 65536 --max-running-requests 256 --enable-dp-attention
  --enable-dp-lm-head --tool-call-parser deepseekv4 --reasoning-parser deepseek-v4 --speculative-algorithm DSPARK
  --disaggregation-mode prefill --disable-flashinfer-autotune --moe-a2a-backend none
  --moe-runner-backend flashinfer_mxfp4 --disaggregation-transfer-backend mooncake
  --disaggregation-ib-device "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7" --log-requests
  --log-requests-level 0 --enable-metrics --enable-cache-report --host 0.0.0.0 --port 30000
"""
SEED_DECODE = """
sglang serve --trust-remote-code --model-path /data2/DeepSeek-V4-Flash-DSpark --tp 8 --dp 8
  --mem-fraction-static 0.8 --max-running-requests 256 --enable-dp-attention --enable-dp-lm-head
  --cuda-graph-bs-decode 1 2 3 4 5 6 7 8 9 10 12 16 --tool-call-parser deepseekv4 --reasoning-parser deepseek-v4
  --speculative-algorithm DSPARK --disaggregation-mode decode --disable-flashinfer-autotune --moe-a2a-backend none
  --moe-runner-backend flashinfer_mxfp4 --disaggregation-transfer-backend mooncake
  --disaggregation-ib-device "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7" --log-requests
  --log-requests-level 0 --enable-metrics --enable-cache-report --host 0.0.0.0 --port 30020
"""
FULL_NAMES = {"--tp": "--tp-size", "--dp": "--dp-size"}


def flags(tokens: list[str]) -> dict[str, tuple[str, ...]]:
    """Command-line tokens as {flag: values}, order-insensitive across flags."""
    out: dict[str, tuple[str, ...]] = {}
    flag = None
    for tok in tokens:
        if tok.startswith("--"):
            flag = FULL_NAMES.get(tok, tok)
            out[flag] = ()
        else:
            assert flag is not None, f"value {tok!r} before any flag"
            out[flag] += (tok,)
    return out


def seed_flags(command: str) -> dict[str, tuple[str, ...]]:
    tokens = shlex.split(command)
    assert tokens[:2] == ["sglang", "serve"]
    return flags(tokens[2:])


def rendered(role: str) -> dict[str, Any]:
    obj = seed()
    (dep,) = [o for o in render(spec_of(obj), obj["metadata"])
              if o["kind"] == "Deployment" and o["metadata"]["labels"]["specserving.io/role"] == role]
    return dep["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def test_prefill_args_equal_the_seed_apart_from_the_explicit_bootstrap_port() -> None:
    got = flags(rendered("prefill")["args"])
    want = seed_flags(SEED_PREFILL)
    assert got.pop("--disaggregation-bootstrap-port") == ("8998",)  # SGLang's default, made explicit
    assert got == want


def test_decode_args_equal_the_seed_apart_from_the_shared_port() -> None:
    got = flags(rendered("decode")["args"])
    want = seed_flags(SEED_DECODE)
    assert want.pop("--port") == ("30020",)
    assert got.pop("--port") == ("30000",)  # one port for both pools: the router's discovery probes one port
    assert got == want


def test_launcher_is_sglangs_module_entry_point() -> None:
    assert rendered("decode")["command"] == ["python3", "-m", "sglang.launch_server"]
