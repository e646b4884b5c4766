"""Write a tiny DeepSeek-V4 checkpoint config that bundles a DSPARK draft head, for hack/device/first-decode.sh.

    python tiny_dsv4.py OUT_DIR

Only config.json is written, on CPU: the servers load random weights with SGLang's own dummy loader
(`--load-format dummy`), so no weight file is hand-named here. The fields start from the release's own
`DeepSeekV4Config` defaults (the DeepSeek-V4-Flash shape) and shrink the sizes, so one H200 holds a prefill and a
decode server side by side; the dspark_* keys mark the bundled draft, as DeepSeek-V4-Flash-DSpark's checkpoint does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

LAYERS = 4
SMALL = {"hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 256, "num_hidden_layers": LAYERS,
         "num_attention_heads": 16, "n_routed_experts": 16, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
         "q_lora_rank": 256, "o_lora_rank": 256, "o_groups": 2, "index_n_heads": 8, "index_topk": 64,
         "max_position_embeddings": 8192}


def main() -> None:
    out = sys.argv[1]
    from sglang.srt.configs.deepseek_v4 import DeepSeekV4Config

    own = DeepSeekV4Config.__annotations__  # its own fields, not PretrainedConfig's
    config = {f.name: f.default for f in dataclasses.fields(DeepSeekV4Config)
              if f.name in own and isinstance(f.default, (bool, int, float, str))}
    config.update(SMALL)
    config.update(
        architectures=["DeepseekV4ForCausalLM"], torch_dtype="bfloat16", sliding_window=config["window_size"],
        compress_ratios=[128, 128] + [4 if i % 2 else 128 for i in range(LAYERS - 2)] + [0],
        n_hash_layers=min(config.get("n_hash_layers", 0), LAYERS),
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 512, "beta_fast": 32,
                      "beta_slow": 1},
        dspark_block_size=4, dspark_markov_rank=1, dspark_noise_token_id=config["vocab_size"] - 2,
        dspark_target_layer_ids=[1, LAYERS - 1],
    )
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    print(os.path.join(out, "config.json"))


if __name__ == "__main__":
    main()
