// The continuous-batching engine (engine.h) from Python: a model file, its tokenizer and an
// Engine, stepped by the Python layer (pagedattn/llm.py) with the GIL released while it works.
//
// The Engine is single-threaded; a mutex serialises calls from several Python threads, and every
// call that may wait on it or run the model releases the GIL first.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "pagedattn/chat_template.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"
#include "pagedattn/model.h"
#include "pagedattn/model_file.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::python {

namespace {

// Text that may end inside a UTF-8 character (a stream cut by max_tokens) as a Python str: invalid
// bytes become U+FFFD instead of an exception.
nb::object utf8(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace");
  if (!o) throw nb::python_error();
  return nb::steal(o);
}

struct EngineOptions {
  std::string device = "auto";
  std::string kv_cache_dtype = "auto";
  int64_t kv_cache_tokens = 0;
  double kv_cache_memory_mib = 0;
  double kv_cache_memory_fraction = 0;
  int32_t page_size = 16;
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 0;
  bool enable_prefix_cache = true;
  bool exact_matmul = false;  // CPU: f32 activations instead of int8 blocks (EngineConfig)
  bool log_startup = false;
};

Device pick_device(const std::string& d) {
  if (d == "cpu") return Device::cpu;
  if (d == "cuda") {
    PA_CHECK(cuda_device_count() > 0, "LLM: device='cuda' but no CUDA device is usable",
             cuda_available() ? "" : " (or pagedattn was built without CUDA)");
    return Device::cuda;
  }
  PA_CHECK(d == "auto", "LLM: device must be 'auto', 'cpu' or 'cuda', got '", d, "'");
  return cuda_device_count() > 0 ? Device::cuda : Device::cpu;
}

class PyEngine {
 public:
  PyEngine(const std::string& model_path, const EngineOptions& o) {
    PA_CHECK(std::filesystem::exists(model_path), "LLM: model '", model_path,
             "' does not exist (a .gguf file or a Hugging Face folder)");
    const Device device = pick_device(o.device);
    nb::gil_scoped_release release;
    std::unique_ptr<Model> model;
    {
      const ModelFile file = load_model_file(model_path, weight_format_for(device));
      model = create_model(file, device);
    }
    tok_ = std::make_shared<Tokenizer>(load_tokenizer(model_path));
    EngineConfig c;
    c.kv_cache_tokens = o.kv_cache_tokens;
    c.kv_cache_memory_mib = o.kv_cache_memory_mib;
    c.kv_cache_memory_fraction = o.kv_cache_memory_fraction;
    c.page_size = o.page_size;
    c.kv_cache_dtype = o.kv_cache_dtype;
    c.enable_prefix_cache = o.enable_prefix_cache;
    c.exact_matmul = o.exact_matmul;
    c.max_num_seqs = o.max_num_seqs;
    c.max_num_batched_tokens = o.max_num_batched_tokens;
    c.max_model_len = o.max_model_len;
    c.log_startup = o.log_startup;
    c.eos_token_ids = tok_->eog_ids();
    if (o.kv_cache_dtype == "fp8") {
      c.kv_calibration_tokens = kv_calibration_tokens(tok_.get(), model->config().vocab_size);
    }
    std::shared_ptr<Tokenizer> tok = tok_;
    auto decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids, true); };
    engine_ = std::make_unique<Engine>(std::move(model), c, decode);
  }

  std::vector<int32_t> encode(const std::string& text, bool add_special) const {
    return tok_->encode(text, add_special, true);
  }
  std::vector<int32_t> encode_chat(const std::vector<std::pair<std::string, std::string>>& msgs,
                                   bool add_generation_prompt) const {
    std::vector<ChatMessage> m;
    for (const auto& [role, content] : msgs) m.push_back({role, content});
    return tok_->encode(apply_chat_template(*tok_, m, add_generation_prompt), false, true);
  }
  nb::object decode(const std::vector<int32_t>& ids, bool skip_special) const {
    return utf8(tok_->decode(ids, skip_special));
  }

  RequestId add_request(Request req) {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    return engine_->add_request(std::move(req));
  }
  std::vector<RequestOutput> step() {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    return engine_->step();
  }
  void cancel(RequestId id) {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    engine_->cancel(id);
  }
  bool has_work() {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    return engine_->has_work();
  }
  nb::dict metrics() {
    EngineMetrics m;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      m = engine_->metrics();
    }
    nb::dict d;
    d["num_running"] = m.num_running;
    d["num_waiting"] = m.num_waiting;
    d["pages_total"] = m.pages_total;
    d["pages_used"] = m.pages_used;
    d["pages_free"] = m.pages_free;
    d["pages_cached"] = m.pages_cached;
    d["kv_capacity_tokens"] = m.kv_capacity_tokens;
    d["prefix_hit_rate"] = m.prefix_hit_rate();
    d["preemptions"] = m.preemptions;
    d["prompt_tokens"] = m.prompt_tokens;
    d["generation_tokens"] = m.generation_tokens;
    d["requests_finished"] = m.requests_finished;
    d["steps"] = m.steps;
    return d;
  }

  const Engine& engine() const { return *engine_; }
  const Tokenizer& tokenizer() const { return *tok_; }

 private:
  std::shared_ptr<Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
  std::mutex mu_;
};

Request make_request(std::vector<int32_t> prompt, double temperature, int32_t top_k, double top_p,
                     double min_p, double repetition_penalty, std::vector<std::string> stop,
                     std::vector<int32_t> stop_token_ids, int32_t max_tokens, int32_t n,
                     std::optional<uint64_t> seed, bool ignore_eos, std::string cache_salt,
                     int32_t best_of, bool use_beam_search, double length_penalty) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = float(temperature);
  r.sampling.top_k = top_k;
  r.sampling.top_p = float(top_p);
  r.sampling.min_p = float(min_p);
  r.sampling.repetition_penalty = float(repetition_penalty);
  r.sampling.stop = std::move(stop);
  r.sampling.stop_token_ids = std::move(stop_token_ids);
  r.max_tokens = max_tokens;
  r.n = n;
  r.seed = seed;
  r.ignore_eos = ignore_eos;
  r.cache_salt = std::move(cache_salt);
  r.best_of = best_of;
  r.use_beam_search = use_beam_search;
  r.length_penalty = float(length_penalty);
  return r;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<EngineOptions>(m, "EngineOptions")
      .def(nb::init<>())
      .def_rw("device", &EngineOptions::device)
      .def_rw("kv_cache_dtype", &EngineOptions::kv_cache_dtype)
      .def_rw("kv_cache_tokens", &EngineOptions::kv_cache_tokens)
      .def_rw("kv_cache_memory_mib", &EngineOptions::kv_cache_memory_mib)
      .def_rw("kv_cache_memory_fraction", &EngineOptions::kv_cache_memory_fraction)
      .def_rw("page_size", &EngineOptions::page_size)
      .def_rw("max_num_seqs", &EngineOptions::max_num_seqs)
      .def_rw("max_num_batched_tokens", &EngineOptions::max_num_batched_tokens)
      .def_rw("max_model_len", &EngineOptions::max_model_len)
      .def_rw("enable_prefix_cache", &EngineOptions::enable_prefix_cache)
      .def_rw("exact_matmul", &EngineOptions::exact_matmul)
      .def_rw("log_startup", &EngineOptions::log_startup);

  nb::class_<Request>(m, "Request");
  m.def("make_request", &make_request, nb::arg("prompt"), nb::arg("temperature"), nb::arg("top_k"),
        nb::arg("top_p"), nb::arg("min_p"), nb::arg("repetition_penalty"), nb::arg("stop"),
        nb::arg("stop_token_ids"), nb::arg("max_tokens"), nb::arg("n"), nb::arg("seed").none(),
        nb::arg("ignore_eos"), nb::arg("cache_salt"), nb::arg("best_of"),
        nb::arg("use_beam_search"), nb::arg("length_penalty"));

  nb::class_<SequenceOutput>(m, "SequenceOutput")
      .def_ro("index", &SequenceOutput::index)
      .def_ro("new_tokens", &SequenceOutput::new_tokens)
      .def_prop_ro("new_text", [](const SequenceOutput& s) { return utf8(s.new_text); })
      .def_prop_ro(
          "finish_reason",
          [](const SequenceOutput& s) { return std::string(finish_reason_name(s.finish)); })
      .def_ro("cumulative_logprob", &SequenceOutput::cumulative_logprob);
  nb::class_<RequestOutput>(m, "StepOutput")
      .def_ro("id", &RequestOutput::id)
      .def_ro("seqs", &RequestOutput::seqs)
      .def_ro("prompt_tokens", &RequestOutput::prompt_tokens)
      .def_ro("cached_tokens", &RequestOutput::cached_tokens)
      .def_ro("completion_tokens", &RequestOutput::completion_tokens)
      .def_ro("finished", &RequestOutput::finished)
      .def_ro("error", &RequestOutput::error);

  nb::class_<PyEngine>(m, "Engine")
      .def(nb::init<const std::string&, const EngineOptions&>(), nb::arg("model"),
           nb::arg("options"))
      .def("encode", &PyEngine::encode, nb::arg("text"), nb::arg("add_special") = true)
      .def("encode_chat", &PyEngine::encode_chat, nb::arg("messages"),
           nb::arg("add_generation_prompt") = true)
      .def("decode", &PyEngine::decode, nb::arg("ids"), nb::arg("skip_special") = true)
      .def("add_request", &PyEngine::add_request, nb::arg("request"))
      .def("step", &PyEngine::step)
      .def("cancel", &PyEngine::cancel, nb::arg("id"))
      .def("has_work", &PyEngine::has_work)
      .def("metrics", &PyEngine::metrics)
      .def_prop_ro("max_model_len", [](const PyEngine& e) { return e.engine().max_model_len(); })
      .def_prop_ro("device",
                   [](const PyEngine& e) { return device_name(e.engine().model().device()); })
      .def_prop_ro("architecture",
                   [](const PyEngine& e) { return e.engine().model().config().architecture; })
      .def_prop_ro("vocab_size",
                   [](const PyEngine& e) { return e.engine().model().config().vocab_size; })
      .def_prop_ro("kv_cache_dtype", [](const PyEngine& e) {
        return std::string(dtype_name(e.engine().cache().config().dtype));
      });
}

}  // namespace pagedattn::python
