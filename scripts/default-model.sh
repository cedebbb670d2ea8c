# The default model's file under models/ and its SHA-256, sourced by the scripts that use it (the
# C++ code's copy: include/pagedattn/default_model.h; keep the two the same).
DEFAULT_MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
DEFAULT_MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
