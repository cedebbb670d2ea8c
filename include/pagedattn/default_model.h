// The default model, used wherever none is named: SmolLM2-135M-Instruct as a Q4_1 GGUF file,
// fetched into models/ by scripts/fetch-default-model.sh (whose name for it comes from
// scripts/default-model.sh: keep the two the same).
#pragma once

namespace pagedattn {

inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
// Relative to the repository root (the CLI's working directory in every documented command).
inline constexpr const char* kDefaultModelPath = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

}  // namespace pagedattn
