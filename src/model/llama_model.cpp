// LlamaModel on the CPU: weights by Hugging Face name, in their file's format; fp32 activations over
// the paged KV cache.
#include <algorithm>
#include <cstring>

#include "cpu_ops.h"
#include "quant_matmul.h"
#include "quant_pack.h"
#include "pagedattn/attention.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/llama_cuda.h"
#include "rope.h"

namespace pagedattn {

namespace {

constexpr const char* kOp = "LlamaModel";

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool supported_architecture(const std::string& a) {
  return a == "llama" || a == "mistral" || a == "qwen2" || a == "qwen3";
}

// The f32 CPU tensor `name` of exactly `shape`, or Error naming it.
const float* weight(const std::map<std::string, Tensor>& tensors, const std::string& name,
                    const std::vector<int64_t>& shape) {
  auto it = tensors.find(name);
  PA_CHECK(it != tensors.end(), kOp, ": tensor ", name, " is missing from the model file");
  const Tensor& t = it->second;
  PA_CHECK(t.dtype() == DType::f32, kOp, ": tensor ", name, " has dtype ", dtype_name(t.dtype()),
           ", expected f32");
  PA_CHECK(t.device() == Device::cpu, kOp, ": tensor ", name, " is on ", device_name(t.device()),
           ", expected cpu");
  PA_CHECK(t.shape() == shape, kOp, ": tensor ", name, " has shape ", t.shape_str(), ", expected ",
           shape_text(shape));
  return t.data_as<float>();
}

// The matrix `name` of exactly `shape`: in the file's format when the file keeps it so, else the f32
// tensor read in place.
cpu::WeightView matrix(const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, FileWeight>& weights, const std::string& name,
                       const std::vector<int64_t>& shape) {
  cpu::WeightView v;
  v.rows = shape[0];
  v.cols = shape[1];
  if (auto it = weights.find(name); it != weights.end()) {
    const FileWeight& w = it->second;
    PA_CHECK(w.shape == shape, kOp, ": tensor ", name, " has shape ", shape_text(w.shape),
             ", expected ", shape_text(shape));
    PA_CHECK(ggml_type_supported(w.ggml_type), kOp, ": tensor ", name, " has unsupported type ",
             ggml_type_name(w.ggml_type));
    v.type = GGMLType(w.ggml_type);
    PA_CHECK(w.row_bytes == v.cols / ggml_block_size(v.type) * ggml_block_bytes(v.type) &&
                 v.cols % ggml_block_size(v.type) == 0,
             kOp, ": tensor ", name, " has rows of ", w.row_bytes, " bytes, not whole ",
             ggml_type_name(w.ggml_type), " blocks of ", v.cols, " values");
    v.row_bytes = w.row_bytes;
    v.data = w.data.get();
    return v;
  }
  v.type = GGMLType::f32;
  v.row_bytes = v.cols * int64_t(sizeof(float));
  v.data = reinterpret_cast<const uint8_t*>(weight(tensors, name, shape));
  return v;
}

}  // namespace

void check_llama_config(ModelConfig& c, const char* op) {
  PA_CHECK(supported_architecture(c.architecture), op, ": architecture '", c.architecture,
           "' is not supported (llama, mistral, qwen2, qwen3)");
  PA_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0, op,
           ": config needs positive vocab_size, hidden_size, intermediate_size and num_layers");
  PA_CHECK(c.num_q_heads > 0 && c.num_kv_heads > 0, op,
           ": config needs positive num_q_heads and num_kv_heads");
  PA_CHECK(c.num_q_heads % c.num_kv_heads == 0, op, ": num_q_heads (", c.num_q_heads,
           ") is not a multiple of num_kv_heads (", c.num_kv_heads, ")");
  if (c.head_dim == 0) {
    PA_CHECK(c.hidden_size % c.num_q_heads == 0, op, ": hidden_size (", c.hidden_size,
             ") is not a multiple of num_q_heads (", c.num_q_heads, ") and head_dim is not set");
    c.head_dim = c.hidden_size / c.num_q_heads;
  }
  PA_CHECK(c.rms_norm_eps > 0.f, op, ": rms_norm_eps must be positive");
  PA_CHECK(c.sliding_window >= 0, op, ": sliding_window must be >= 0");
}

LlamaModel::LlamaModel(const ModelFile& file)
    : config_(file.config), tensors_(file.tensors), weights_(file.weights) {
  ModelConfig& c = config_;
  check_llama_config(c, kOp);
  inv_freq_ = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling);
  rope_scale_ = rope_attention_factor(c.rope_scaling);

  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, d = c.head_dim;
  const int64_t q_dim = int64_t(c.num_q_heads) * d, kv_dim = int64_t(c.num_kv_heads) * d;
  auto mat = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return matrix(tensors_, weights_, name, shape);
  };
  embed_ = mat("model.embed_tokens.weight", {c.vocab_size, hidden});
  final_norm_ = weight(tensors_, "model.norm.weight", {hidden});
  lm_head_ = tensors_.count("lm_head.weight") || weights_.count("lm_head.weight")
                 ? mat("lm_head.weight", {c.vocab_size, hidden})
                 : embed_;
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer L{};
    L.attn_norm = weight(tensors_, p + "input_layernorm.weight", {hidden});
    L.wq = mat(p + "self_attn.q_proj.weight", {q_dim, hidden});
    L.wk = mat(p + "self_attn.k_proj.weight", {kv_dim, hidden});
    L.wv = mat(p + "self_attn.v_proj.weight", {kv_dim, hidden});
    if (c.attention_bias) {
      L.bq = weight(tensors_, p + "self_attn.q_proj.bias", {q_dim});
      L.bk = weight(tensors_, p + "self_attn.k_proj.bias", {kv_dim});
      L.bv = weight(tensors_, p + "self_attn.v_proj.bias", {kv_dim});
    }
    if (c.qk_norm) {
      L.q_norm = weight(tensors_, p + "self_attn.q_norm.weight", {d});
      L.k_norm = weight(tensors_, p + "self_attn.k_norm.weight", {d});
    }
    L.wo = mat(p + "self_attn.o_proj.weight", {hidden, q_dim});
    L.mlp_norm = weight(tensors_, p + "post_attention_layernorm.weight", {hidden});
    L.w_gate = mat(p + "mlp.gate_proj.weight", {inter, hidden});
    L.w_up = mat(p + "mlp.up_proj.weight", {inter, hidden});
    L.w_down = mat(p + "mlp.down_proj.weight", {hidden, inter});
    layers_.push_back(L);
  }
  pack_matrices();
}

// NOTE: the Q4_0/Q4_1/Q8_0 matrices are read in the x16 layout (quant_pack.h): the same blocks
// with sixteen rows interleaved, so a vector instruction serves 16 (or 8) output rows and their
// scales load together. Packing copies them once; the mapped file pages already packed are handed
// back as it goes, so resident memory stays one copy of the weights. The file matrices packed are
// dropped here (the copies the loader made, e.g. of reordered q/k rows, are freed with the file).
void LlamaModel::pack_matrices() {
  std::map<const uint8_t*, cpu::PackedWeight> done;  // by source data (tied matrices pack once)
  auto pack = [&](W& v) {
    if (!cpu::x16_packable(v.type) || v.x16) return;
    auto it = done.find(v.data);
    if (it == done.end()) {
      auto file = std::find_if(weights_.begin(), weights_.end(),
                               [&](const auto& w) { return w.second.data.get() == v.data; });
      const bool mapped = file != weights_.end() && file->second.mapped;
      it = done.emplace(v.data, cpu::pack_x16(v, mapped)).first;
      packed_.push_back(it->second.storage);
      if (file != weights_.end()) weights_.erase(file);
    }
    v = it->second.view;
  };
  for (Layer& L : layers_)
    for (W* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) pack(*v);
  pack(embed_);
  pack(lm_head_);
}

void LlamaModel::validate(const ForwardBatch& b, const KvCache& cache) const {
  constexpr const char* op = "LlamaModel::forward";
  const KvCacheConfig& cc = cache.config();
  PA_CHECK(cc.device == Device::cpu, op, ": cache is on ", device_name(cc.device),
           "; the CPU model needs a CPU cache");
  PA_CHECK(cc.num_layers == config_.num_layers && cc.num_kv_heads == config_.num_kv_heads &&
               cc.head_dim == config_.head_dim,
           op, ": cache has ", cc.num_layers, " layers x ", cc.num_kv_heads,
           " KV heads x head_dim ", cc.head_dim, ", the model needs ", config_.num_layers, " x ",
           config_.num_kv_heads, " x ", config_.head_dim);
  check_forward_batch(b, config_.vocab_size, cc.page_size, cc.num_pages, op);
}

Tensor LlamaModel::forward(const ForwardBatch& batch, KvCache& cache) {
  validate(batch, cache);
  const ModelConfig& c = config_;
  const int32_t num_tokens = int32_t(batch.tokens.size());
  const int64_t hidden = c.hidden_size;
  Tensor logits = Tensor::empty({int64_t(batch.logit_rows.size()), c.vocab_size}, DType::f32);
  if (num_tokens == 0) return logits;

  // The attention planned once for every layer (the step batch carries its layout; every layer
  // has the same shapes), and RoPE tables for the tokens' positions.
  const int32_t Hq = c.num_q_heads, D = c.head_dim;
  ws_.q.resize(size_t(num_tokens) * size_t(Hq * D));
  ws_.attn.resize(size_t(num_tokens) * size_t(Hq * D));
  {
    AttentionOptions opt;
    opt.window = c.sliding_window;
    ws_.attention.plan(QKVTensor{ws_.q.data(), DType::f32, num_tokens, Hq, D},
                       cache.layer_view(0), attention_layout(batch), opt,
                       QKVTensor{ws_.attn.data(), DType::f32, num_tokens, Hq, D});
  }
  const size_t half = size_t(c.head_dim / 2);
  ws_.rope_cos.resize(size_t(num_tokens) * half);
  ws_.rope_sin.resize(size_t(num_tokens) * half);
  rope_tables(inv_freq_, batch.positions.data(), num_tokens, ws_.rope_cos.data(),
              ws_.rope_sin.data(), rope_scale_);

  ws_.x.resize(size_t(num_tokens) * size_t(hidden));
  for (int32_t t = 0; t < num_tokens; ++t)
    cpu::weight_row(embed_, batch.tokens[size_t(t)], ws_.x.data() + t * hidden);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    run_layer(layers_[size_t(i)], i, num_tokens, batch.slots.data(), cache);
  }

  // Final norm and lm_head for the requested rows only.
  const int64_t rows = int64_t(batch.logit_rows.size());
  ws_.h.resize(size_t(rows * hidden));
  for (int64_t r = 0; r < rows; ++r) {
    cpu::rms_norm(ws_.x.data() + int64_t(batch.logit_rows[size_t(r)]) * hidden, final_norm_, 1,
                  hidden, c.rms_norm_eps, ws_.h.data() + r * hidden);
  }
  ws_.in.set(ws_.h.data(), rows, hidden);
  cpu::matmul(ws_.in, lm_head_, logits.data_as<float>(),
              exact_matmul_ ? cpu::MatmulMode::exact : cpu::MatmulMode::fast);
  return logits;
}

void LlamaModel::run_layer(const Layer& w, int32_t layer, int32_t num_tokens,
                           const int32_t* slots, KvCache& cache) {
  const ModelConfig& c = config_;
  const int64_t T = num_tokens, hidden = c.hidden_size, inter = c.intermediate_size;
  const int32_t D = c.head_dim, Hq = c.num_q_heads, Hkv = c.num_kv_heads;
  const int64_t q_dim = int64_t(Hq) * D, kv_dim = int64_t(Hkv) * D;
  ws_.h.resize(size_t(T * hidden));
  ws_.q.resize(size_t(T * q_dim));
  ws_.k.resize(size_t(T * kv_dim));
  ws_.v.resize(size_t(T * kv_dim));
  ws_.attn.resize(size_t(T * q_dim));
  ws_.gate.resize(size_t(T * inter));
  ws_.up.resize(size_t(T * inter));
  float *x = ws_.x.data(), *h = ws_.h.data(), *q = ws_.q.data(), *k = ws_.k.data(),
        *v = ws_.v.data(), *attn = ws_.attn.data();

  // Attention block.
  const cpu::MatmulMode mode = exact_matmul_ ? cpu::MatmulMode::exact : cpu::MatmulMode::fast;
  cpu::MatmulInput& in = ws_.in;
  cpu::rms_norm(x, w.attn_norm, T, hidden, c.rms_norm_eps, h);
  in.set(h, T, hidden);
  cpu::matmul(in, {{&w.wq, q}, {&w.wk, k}, {&w.wv, v}}, mode);
  if (w.bq) {
    cpu::add_bias(q, w.bq, T, q_dim);
    cpu::add_bias(k, w.bk, T, kv_dim);
    cpu::add_bias(v, w.bv, T, kv_dim);
  }
  if (w.q_norm) {
    cpu::rms_norm(q, w.q_norm, T * Hq, D, c.rms_norm_eps, q);
    cpu::rms_norm(k, w.k_norm, T * Hkv, D, c.rms_norm_eps, k);
  }
  rope_apply(q, num_tokens, Hq, D, ws_.rope_cos.data(), ws_.rope_sin.data());
  rope_apply(k, num_tokens, Hkv, D, ws_.rope_cos.data(), ws_.rope_sin.data());

  if (absmax_) observe_kv(layer, num_tokens);
  const PagedKVView view = cache.layer_view(layer);
  write_kv_cpu(view, slots, num_tokens, k, v, DType::f32);
  const QKVTensor q_t{q, DType::f32, num_tokens, Hq, D};
  QKVTensor out_t{attn, DType::f32, num_tokens, Hq, D};
  ws_.attention.run(q_t, view, out_t);
  in.set(attn, T, q_dim);
  cpu::matmul(in, w.wo, h, mode);
  cpu::add_inplace(x, h, T * hidden);

  // MLP block.
  cpu::rms_norm(x, w.mlp_norm, T, hidden, c.rms_norm_eps, h);
  in.set(h, T, hidden);
  cpu::matmul(in, {{&w.w_gate, ws_.gate.data()}, {&w.w_up, ws_.up.data()}}, mode);
  cpu::silu_mul(ws_.gate.data(), ws_.up.data(), T * inter);
  in.set(ws_.gate.data(), T, inter);
  cpu::matmul(in, w.w_down, h, mode);
  cpu::add_inplace(x, h, T * hidden);
}

}  // namespace pagedattn

namespace pagedattn {

std::unique_ptr<Model> create_model(const ModelFile& file, Device device) {
  if (device == Device::cuda) {
    PA_CHECK(cuda_device_count() > 0,
             "create_model: device cuda has no usable CUDA device (none found, or pagedattn was "
             "built without CUDA); use cpu");
    // NOTE: the CUDA runner uploads f32 host tensors (as bf16); file-format matrices are
    // dequantised for it here.
    if (!file.weights.empty()) return std::make_unique<LlamaModelCuda>(with_f32_weights(file));
    return std::make_unique<LlamaModelCuda>(file);
  }
  return std::make_unique<LlamaModel>(file);
}

WeightFormat weight_format_for(Device device) {
  return device == Device::cpu ? WeightFormat::file : WeightFormat::stored;
}

}  // namespace pagedattn
