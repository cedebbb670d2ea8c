#include "model_session.h"

#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>

#include "pagedattn/error.h"
#include "pagedattn/model_file.h"
#include "pagedattn/synthetic_model.h"

namespace pagedattn::tools {

Device resolve_device(const std::string& name) {
  if (name == "cuda") return Device::cuda;  // create_model says so when there is none
  if (name == "cpu") return Device::cpu;
  PA_CHECK(name == "auto", "--device: expected auto, cpu or cuda, got '", name, "'");
  return cuda_device_count() > 0 ? Device::cuda : Device::cpu;
}

std::unique_ptr<Model> load_model(const std::string& model, Device device) {
  if (is_synthetic_model(model)) return create_synthetic_model(model, device);
  PA_CHECK(std::filesystem::exists(model), "--model: '", model,
           "' does not exist (fetch the default model with scripts/fetch-default-model.sh)");
  const ModelFile file = load_model_file(model, weight_format_for(device));
  return create_model(file, device);  // the runner keeps the weights it needs, not the file
}

void require_tokenizer(const std::string& model, const char* command) {
  PA_CHECK(!is_synthetic_model(model), command, ": --model ", model,
           " is a synthetic model (random weights, no tokenizer) and this command needs a "
           "tokenizer; synthetic models work with bench model, bench serve and logits");
}

void add_session_options(CLI::App& cmd, SessionOptions& opt) {
  cmd.add_option("--model", opt.model,
                 "A .gguf file, a Hugging Face folder or synthetic:NAME (random weights, no "
                 "tokenizer: synthetic:llama3-8b, synthetic:smollm2-135m, synthetic:tiny)")
      ->capture_default_str();
  cmd.add_option("--device", opt.device, "auto (cuda when a CUDA device is usable), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd.add_option("--kv-cache-dtype", opt.kv_cache_dtype,
                 "auto (the compute dtype), fp8 (e4m3, calibrated scales), f32, f16 or bf16")
      ->check(CLI::IsMember({"auto", "fp8", "f32", "f16", "bf16"}))
      ->capture_default_str();
  cmd.add_flag("--exact-matmul", opt.exact_matmul,
               "CPU: f32 activations against the dequantised weights instead of int8 activation "
               "blocks (slower; no activation rounding)");
}

namespace {

bool expects_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  if (is_synthetic_model(path)) return false;
  return !fs::is_directory(path) || fs::exists(fs::path(path) / "tokenizer.json");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

ModelSession::ModelSession(const SessionOptions& opt) : opt_(opt) {
  PA_CHECK(opt.page_size > 0 && opt.kv_tokens > 0 && opt.prefill_chunk > 0,
           "ModelSession: page_size, kv_tokens and prefill_chunk must be positive");
  const auto t0 = std::chrono::steady_clock::now();
  model_ = load_model(opt.model, resolve_device(opt.device));
  model_->set_exact_matmul(opt.exact_matmul);
  if (expects_tokenizer(opt.model)) tokenizer_ = load_tokenizer(opt.model);
  const ModelConfig& c = model_->config();

  KvCacheConfig kc;
  kc.num_layers = c.num_layers;
  kc.num_kv_heads = c.num_kv_heads;
  kc.head_dim = c.head_dim;
  kc.page_size = opt.page_size;
  kc.num_pages = int32_t((opt.kv_tokens + opt.page_size - 1) / opt.page_size);
  kc.device = model_->device();
  kc.enable_prefix_cache = false;
  const DType compute_dtype = kc.device == Device::cuda ? DType::bf16 : DType::f32;
  kc.dtype = opt.kv_cache_dtype == "auto" ? compute_dtype : parse_dtype(opt.kv_cache_dtype);
  cache_ = std::make_unique<KvCache>(kc);
  if (kc.dtype == DType::fp8_e4m3) {
    std::vector<int32_t> calib;
    if (tokenizer_) {
      calib = tokenizer_->encode(kv_calibration_text(), true, false);
    } else {  // no tokenizer (a bare test folder): a fixed pseudo-random token stream
      std::mt19937 g(1234);
      for (int i = 0; i < 256; ++i) calib.push_back(int32_t(g() % uint32_t(c.vocab_size)));
    }
    calibrate_kv_scales(*model_, *cache_, calib);
  }
  if (!opt.quiet) {
    const double mib = double(kc.num_pages) * kc.page_size * c.num_layers * c.num_kv_heads *
                       c.head_dim * 2 * double(dtype_size(kc.dtype)) / (1024.0 * 1024.0);
    std::cerr << "model: " << opt.model << " (" << c.architecture << ", " << c.num_layers
              << " layers, hidden " << c.hidden_size << ", vocab " << c.vocab_size << ") on "
              << device_name(model_->device()) << ", loaded in " << seconds_since(t0) << " s\n"
              << "kv cache: " << kc.num_pages << " pages x " << kc.page_size << " tokens, "
              << dtype_name(kc.dtype) << ", " << mib << " MiB\n";
  }
}

const Tokenizer& ModelSession::tokenizer() const {
  PA_CHECK(tokenizer_.has_value(), "tokenizer: '", opt_.model, "' has no tokenizer",
           is_synthetic_model(opt_.model) ? " (synthetic models have random weights and none; "
                                            "use bench model, bench serve or logits)"
                                          : " (pass token ids instead)");
  return *tokenizer_;
}

std::vector<int32_t> ModelSession::stop_ids() const {
  std::vector<int32_t> ids = config().eos_token_ids;
  if (tokenizer_) ids.insert(ids.end(), tokenizer_->eog_ids().begin(), tokenizer_->eog_ids().end());
  return ids;
}

Tensor ModelSession::prefill(const std::vector<SeqId>& seqs,
                             const std::vector<std::vector<int32_t>>& tokens, bool all_rows) {
  PA_CHECK(seqs.size() == tokens.size(), "prefill: ", seqs.size(), " seqs but tokens for ",
           tokens.size());
  const size_t S = seqs.size();
  const int64_t vocab = config().vocab_size;
  std::vector<int64_t> base(S + 1, 0);  // all_rows: first output row of each sequence
  for (size_t s = 0; s < S; ++s) {
    PA_CHECK(all_rows || !tokens[s].empty(), "prefill: tokens[", s, "] is empty");
    base[s + 1] = base[s] + int64_t(tokens[s].size());
  }
  Tensor out = Tensor::empty({all_rows ? base[S] : int64_t(S), vocab}, DType::f32);
  std::vector<size_t> done(S, 0);
  size_t next = 0;  // the first sequence with tokens left
  while (next < S) {
    // One step: chunks from the sequences in order until the token budget is spent.
    std::vector<SeqId> step_seqs;
    std::vector<std::vector<int32_t>> chunks;
    std::vector<size_t> which;
    int64_t budget = opt_.prefill_chunk;
    for (size_t s = next; s < S && budget > 0; ++s) {
      const size_t n = std::min<size_t>(tokens[s].size() - done[s], size_t(budget));
      if (n == 0) continue;
      step_seqs.push_back(seqs[s]);
      chunks.emplace_back(tokens[s].begin() + ptrdiff_t(done[s]),
                          tokens[s].begin() + ptrdiff_t(done[s] + n));
      which.push_back(s);
      budget -= int64_t(n);
    }
    Tensor logits;
    if (!step_seqs.empty()) {
      logits = model_->forward(make_forward_batch(*cache_, step_seqs, chunks, all_rows), *cache_);
      for (SeqId s : step_seqs) cache_->commit(s);
    }
    int64_t row = 0;
    for (size_t i = 0; i < which.size(); ++i) {
      const size_t s = which[i];
      const int64_t n = int64_t(chunks[i].size());
      const float* src = logits.data_as<float>() + row * vocab;
      if (all_rows) {
        std::copy(src, src + n * vocab,
                  out.data_as<float>() + (base[s] + int64_t(done[s])) * vocab);
        row += n;
      } else {
        if (done[s] + size_t(n) == tokens[s].size()) {
          std::copy(src, src + vocab, out.data_as<float>() + int64_t(s) * vocab);
        }
        row += 1;
      }
      done[s] += size_t(n);
    }
    while (next < S && done[next] == tokens[next].size()) ++next;
  }
  return out;
}

namespace {

// One new token per sequence.
ForwardBatch decode_batch(KvCache& cache, const std::vector<SeqId>& seqs,
                          const std::vector<int32_t>& tokens, const char* what) {
  PA_CHECK(seqs.size() == tokens.size(), what, ": ", seqs.size(), " seqs but ", tokens.size(),
           " tokens");
  std::vector<std::vector<int32_t>> work;
  for (int32_t t : tokens) work.push_back({t});
  return make_forward_batch(cache, seqs, work);
}

}  // namespace

Tensor ModelSession::decode(const std::vector<SeqId>& seqs, const std::vector<int32_t>& tokens) {
  Tensor logits = model_->forward(decode_batch(*cache_, seqs, tokens, "decode"), *cache_);
  for (SeqId s : seqs) cache_->commit(s);
  return logits;
}

std::vector<int32_t> ModelSession::decode_greedy(const std::vector<SeqId>& seqs,
                                                 const std::vector<int32_t>& tokens) {
  std::vector<int32_t> ids =
      model_->forward_greedy(decode_batch(*cache_, seqs, tokens, "decode_greedy"), *cache_);
  for (SeqId s : seqs) cache_->commit(s);
  return ids;
}

}  // namespace pagedattn::tools
