#!/usr/bin/env python3
"""Writes tests/model/rope_scaling_golden.json: transformers' inverse RoPE frequencies and cos/sin
factor (modeling_rope_utils.ROPE_INIT_FUNCTIONS) for linear and YaRN scaling on a few configs,
the oracle of RopeScaling.*MatchTransformers (test_llama_ops.cpp). Needs torch and transformers:

    python3 tests/model/rope_scaling_oracle.py > tests/model/rope_scaling_golden.json
"""
import json
import sys

import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# (head_dim, rope_theta, max_position_embeddings, rope_scaling)
CASES = [
    (64, 10000.0, 2048, {"rope_type": "linear", "factor": 2.0}),
    (128, 500000.0, 8192, {"rope_type": "linear", "factor": 4.0}),
    (128, 1000000.0, 131072, {"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 32768}),
    (64, 10000.0, 32768, {"rope_type": "yarn", "factor": 8.0,
                          "original_max_position_embeddings": 4096}),
    (128, 10000.0, 16384, {"rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 4096, "beta_fast": 16.0,
                           "beta_slow": 2.0, "truncate": False}),
    (128, 10000.0, 32768, {"rope_type": "yarn", "factor": 8.0,
                           "original_max_position_embeddings": 4096, "mscale": 0.707,
                           "mscale_all_dim": 1.0}),
    (64, 50000.0, 4096, {"rope_type": "yarn", "factor": 2.0,
                         "original_max_position_embeddings": 2048, "attention_factor": 1.25}),
    (256, 10000.0, 65536, {"rope_type": "yarn", "factor": 8.0,
                           "original_max_position_embeddings": 8192}),
]


def main():
    out = {"transformers": transformers.__version__, "cases": []}
    for head_dim, theta, max_pos, scaling in CASES:
        rope = dict(scaling, rope_theta=theta)
        cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                          max_position_embeddings=max_pos, rope_parameters=rope)
        inv, attn = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu")
        out["cases"].append({"head_dim": head_dim, "rope_theta": theta,
                             "max_position_embeddings": max_pos, "rope_scaling": scaling,
                             "inv_freq": [float(x) for x in inv.tolist()],
                             "attention_factor": float(attn)})
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
