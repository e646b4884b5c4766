"""SGLang's own start-up checks on rendered server command lines, in one release's interpreter, without a GPU.

    python server_args_check.py CASES_JSON      (in a decode_path interpreter)

CASES_JSON is a list of {"label", "args", "env", "model", "draft"}: `args` is a container's argv as rendered, `env`
its literal env values, `model` and `draft` the stand-in checkpoint (below) for --model-path and
--speculative-draft-model-path: a CONFIGS name, or [name, {key: value}] for one with keys set.

Each line goes through what `sglang serve` does before it touches a GPU: the release's own argparse parser
(`ServerArgs.add_cli_args`, allow_abbrev off, as elsewhere in the tier), `ServerArgs.from_cli_args`, which runs
`__post_init__` (the ordered handlers that refuse bad combinations and fill defaults), and from 0.5.19 on
`resolve_once()` (the resolution pipeline the launcher runs before publishing the arguments).

Stand-ins, for what exists only on a GPU node; each answers the question a handler asks, and the handler's own
code runs on the answer:
- STAND-IN accelerator: `torch.cuda` answers as eight NVIDIA H200 (compute capability 9.0, 141 GiB, 132 SMs) and
  `torch.version.cuda` as 12.9. Installed after the SGLang modules a handler imports lazily are loaded, so no
  module takes its CUDA-only import path. It cannot show the real driver's answers, nor a kernel's.
- STAND-IN /sys/class/infiniband: lists mlx5_0 ... mlx5_7, the seed node's NICs, for the IB-device check
  (`_validate_ib_devices`), which then runs in full. It cannot show that a real node has those NICs.
- STAND-IN checkpoints: a directory holding only a config.json per architecture (CONFIGS below), in place of
  the model and draft paths, which do not exist here. The sizes are the published ones where we know them
  (Llama-3.1-70B), SGLang's own config class defaults otherwise (DeepSeek-V4), and Kimi-K2's shape for Kimi-K3;
  the DSPARK keys mark a checkpoint that bundles its draft, as DeepSeek-V4-Flash-DSpark does. Checks that read
  the checkpoint are only as right as these files: they cannot show that a real checkpoint's config passes.
- `$(VAR)` references in the argv are expanded from the container's env and, for the ones LeaderWorkerSet
  injects, from stand-in values (leader 10.0.0.1, worker 0), as the kubelet would.

Output: one JSON document on stdout: {"results": [{"label", "error", "resolved"}], "standIns": [...]}, where
`error` is "<ExceptionType>: <message>" when SGLang refused the line, `resolved` a few settings as SGLang left
them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import json
import os
import re
import sys
import tempfile
import types
from typing import Any

# Loaded before the accelerator stand-in is installed: each one decides at import time, from torch.cuda, whether
# to import CUDA-only kernels (sgl_kernel, flashinfer), which this CPU interpreter does not have.
PRELOAD = (
    "sglang.srt.server_args",
    "sglang.srt.configs.model_config",
    "sglang.srt.layers.sampler",
    "sglang.srt.speculative.dflash_utils",
    "sglang.srt.speculative.dspark_components.dspark_config",
    "sglang.srt.arg_groups.pipeline",
)
GIB = 1 << 30
NICS = [f"mlx5_{i}" for i in range(8)]
IB_SYSFS = "/sys/class/infiniband"
LWS_STAND_INS = {"LWS_LEADER_ADDRESS": "10.0.0.1", "LWS_WORKER_INDEX": "0", "LWS_GROUP_SIZE": "2"}
RESOLVED = ("device", "tp_size", "dp_size", "enable_dp_attention", "disaggregation_mode", "speculative_algorithm",
            "speculative_draft_model_path", "speculative_num_draft_tokens", "disaggregation_ib_device")


def llama_3_1_70b() -> dict[str, Any]:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
            "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
            "num_hidden_layers": 80, "vocab_size": 128256, "max_position_embeddings": 131072,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}


def eagle3_llama_3_1_70b() -> dict[str, Any]:
    return {**llama_3_1_70b(), "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
            "draft_vocab_size": 32000}


def deepseek_v4_dspark() -> dict[str, Any]:
    from sglang.srt.configs.deepseek_v4 import DeepSeekV4Config

    own = DeepSeekV4Config.__annotations__  # its own fields, not PretrainedConfig's
    config = {f.name: f.default for f in dataclasses.fields(DeepSeekV4Config)
              if f.name in own and f.default is not dataclasses.MISSING}
    layers = config["num_hidden_layers"]
    config.update(
        architectures=["DeepseekV4ForCausalLM"], sliding_window=config["window_size"], torch_dtype="bfloat16",
        compress_ratios=[128, 128] + [4 if i % 2 else 128 for i in range(layers - 2)] + [0],
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                      "beta_slow": 1},
        quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                             "weight_block_size": [128, 128]},
        dspark_block_size=4, dspark_markov_rank=1, dspark_noise_token_id=128799, dspark_target_layer_ids=[1, 21, 41],
    )
    return config


def kimi_k3() -> dict[str, Any]:
    text = {"model_type": "kimi_linear", "vocab_size": 163840, "hidden_size": 7168, "num_hidden_layers": 61,
            "num_attention_heads": 64, "num_key_value_heads": 64, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "num_experts": 384, "num_experts_per_token": 8, "num_shared_experts": 1,
            "first_k_dense_replace": 1, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 262144, "rope_theta": 50000.0,
            "torch_dtype": "bfloat16"}
    return {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"], "text_config": text,
            "torch_dtype": "bfloat16"}


def dflash_kimi_k3() -> dict[str, Any]:
    return {"model_type": "qwen3", "architectures": ["DFlashDraftModel"], "hidden_size": 7168,
            "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 18432, "vocab_size": 163840, "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "block_size": 16,
            "num_target_layers": 61,
            "dflash_config": {"block_size": 16, "target_layer_ids": [1, 15, 30, 45, 59], "mask_token_id": 163838}}


def dflash_llama_3_1_70b() -> dict[str, Any]:
    return {**dflash_kimi_k3(), "hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 128256,
            "num_attention_heads": 64, "num_target_layers": 80,
            "dflash_config": {"block_size": 16, "target_layer_ids": [1, 20, 40, 60, 78], "mask_token_id": 128002}}


CONFIGS = {"llama-3.1-70b": llama_3_1_70b, "eagle3-llama-3.1-70b": eagle3_llama_3_1_70b,
           "dflash-llama-3.1-70b": dflash_llama_3_1_70b, "deepseek-v4-dspark": deepseek_v4_dspark,
           "kimi-k3": kimi_k3, "dflash-kimi-k3": dflash_kimi_k3}


def install_accelerator_stand_in() -> None:
    import torch

    props = types.SimpleNamespace(name="NVIDIA H200", total_memory=141 * GIB - 512 * (1 << 20), major=9, minor=0,
                                  multi_processor_count=132, uuid="GPU-stand-in", gcnArchName="",
                                  L2_cache_size=50 * (1 << 20))
    cuda: Any = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 8
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda device=None: (props.major, props.minor)
    cuda.get_device_name = lambda device=None: props.name
    cuda.get_device_properties = lambda device=None: props
    cuda.mem_get_info = lambda device=None: (props.total_memory - GIB, props.total_memory)
    torch.version.cuda = "12.9"  # type: ignore[misc]
    # Device answers SGLang cached while torch still said "no CUDA" (at import) are asked again.
    common = importlib.import_module("sglang.srt.utils.common")
    for value in vars(common).values():
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()
    platforms = sys.modules.get("sglang.srt.platforms")
    if platforms is not None and hasattr(platforms, "_current_platform"):
        platforms._current_platform = None


def install_ib_sysfs_stand_in() -> None:
    isdir, listdir = os.path.isdir, os.listdir

    def is_ib(path: Any) -> bool:
        return str(path).rstrip("/") == IB_SYSFS

    os.path.isdir = lambda path: True if is_ib(path) else isdir(path)  # type: ignore[assignment]
    os.listdir = lambda path=".": list(NICS) if is_ib(path) else listdir(path)  # type: ignore[assignment]


def checkpoint_key(checkpoint: Any) -> str:
    return checkpoint if isinstance(checkpoint, str) else json.dumps(checkpoint, sort_keys=True)


def checkpoints(wanted: list[Any]) -> dict[str, str]:
    """A directory with a config.json per stand-in checkpoint, keyed by checkpoint_key."""
    root = tempfile.mkdtemp(prefix="stand-in-checkpoints-")
    paths: dict[str, str] = {}
    for checkpoint in wanted:
        key = checkpoint_key(checkpoint)
        if key in paths:
            continue
        name, keys = (checkpoint, {}) if isinstance(checkpoint, str) else checkpoint
        path = os.path.join(root, str(len(paths)))
        os.makedirs(path)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({**CONFIGS[name](), **keys}, f)
        paths[key] = path
    return paths


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    values = {**LWS_STAND_INS, **env}
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m.group(1), m.group(0)), a) for a in args]


def with_checkpoints(args: list[str], model: str, draft: str | None) -> list[str]:
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg == "--model-path":
            out[i + 1] = model
        elif arg == "--speculative-draft-model-path" and draft is not None:
            out[i + 1] = draft
    return out


def check(server_args_class: Any, args: list[str]) -> tuple[str | None, dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="sglang", add_help=False, allow_abbrev=False)
    server_args_class.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            namespace = parser.parse_args(args)
    except SystemExit:
        return f"argparse: {err.getvalue().strip().splitlines()[-1]}", {}
    try:
        server_args = server_args_class.from_cli_args(namespace)
        if hasattr(server_args, "resolve_once"):
            server_args.resolve_once()
    except Exception as exc:  # SGLang's refusals are ValueError, RuntimeError, AssertionError, ...
        return f"{type(exc).__name__}: {exc}", {}
    view = server_args
    with contextlib.suppress(ImportError, AttributeError, TypeError):
        view = importlib.import_module("sglang.srt.server_args").resolving_view(server_args)
    return None, {name: _plain(getattr(view, name, None)) for name in RESOLVED}


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def main() -> None:
    cases = json.loads(sys.argv[1])
    for module in PRELOAD:
        with contextlib.suppress(ModuleNotFoundError):  # a module a release does not have yet
            importlib.import_module(module)
    server_args_class = importlib.import_module("sglang.srt.server_args").ServerArgs
    paths = checkpoints([c["model"] for c in cases] + [c["draft"] for c in cases if c.get("draft")])
    install_accelerator_stand_in()
    install_ib_sysfs_stand_in()
    results = []
    for case in cases:
        draft = paths[checkpoint_key(case["draft"])] if case.get("draft") else None
        args = with_checkpoints(expand(case["args"], case.get("env", {})), paths[checkpoint_key(case["model"])], draft)
        error, resolved = check(server_args_class, args)
        results.append({"label": case["label"], "error": error, "resolved": resolved})
    stand_ins = ["torch.cuda: 8x NVIDIA H200 (9.0, 141 GiB)", f"{IB_SYSFS}: {','.join(NICS)}",
                 *(f"checkpoint {key}: config.json only" for key in sorted(paths))]
    print(json.dumps({"results": results, "standIns": stand_ins}))


if __name__ == "__main__":
    main()
