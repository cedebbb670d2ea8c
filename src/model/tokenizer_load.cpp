// Tokenizer loaders: GGUF tokenizer.ggml.* metadata, and Hugging Face tokenizer.json (with
// tokenizer_config.json beside it for bos/eos, add_bos_token and the chat template).
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pagedattn/error.h"
#include "pagedattn/gguf.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn {

namespace fs = std::filesystem;
using nlohmann::json;

struct TokenizerLoader {
  static void set_extras(Tokenizer& t, bool ignore_merges, std::vector<int32_t> extra_eog) {
    t.ignore_merges_ = ignore_merges;
    for (int32_t id : extra_eog)
      if (id >= 0 && id < t.vocab_size() && !t.is_eog(id)) t.eog_ids_.push_back(id);
  }
  // How a tokenizer.json with byte fallback prepares its text (see Tokenizer's members).
  struct SpmJson {
    bool prefix = false, prefix_first = false, prefix_if_no_space = false, split = false,
         strip_first_piece = false;
    int32_t unk = -1;
  };
  static void set_spm_json(Tokenizer& t, const std::vector<std::string>& merges, const SpmJson& o) {
    t.build_index(merges);
    t.spm_ranked_ = true;
    t.add_space_prefix_ = o.prefix;
    t.spm_prefix_first_ = o.prefix_first;
    t.spm_prefix_if_no_space_ = o.prefix_if_no_space;
    t.spm_split_ = o.split;
    t.spm_strip_first_piece_ = o.strip_first_piece;
    if (o.unk >= 0) t.unk_id_ = o.unk;
  }
};

namespace {

// SentencePiece BPE (tokenizer.ggml.model "llama": Llama 2, Mistral): pieces, their scores and
// types, bos/eos, add_bos_token (default true, as llama.cpp) and add_space_prefix (default true).
Tokenizer sentencepiece_from_gguf(const GGUFFile& g, const std::vector<std::string>& pieces,
                                  std::vector<TokenType> types) {
  const std::string& file = g.path();
  const size_t n = pieces.size();
  std::vector<float> scores;
  if (const GGUFValue* s = g.find("tokenizer.ggml.scores")) {
    PA_CHECK(s->type == GGUFType::array && s->floats.size() == n, "Tokenizer::from_gguf: ", file,
             ": key 'tokenizer.ggml.scores' must be a float array of ", n, " entries");
    scores.assign(s->floats.begin(), s->floats.end());
  }
  auto id_of = [&](const char* key) {
    const int64_t id = g.get_int(key, -1);
    PA_CHECK(id >= -1 && id < int64_t(n), "Tokenizer::from_gguf: ", file, ": key '", key, "' = ", id,
             " is outside the vocabulary of ", n);
    return int32_t(id);
  };
  try {
    return Tokenizer::from_sentencepiece(
        pieces, std::move(scores), std::move(types), id_of("tokenizer.ggml.bos_token_id"),
        id_of("tokenizer.ggml.eos_token_id"), g.get_bool("tokenizer.ggml.add_bos_token", true),
        g.get_bool("tokenizer.ggml.add_space_prefix", true),
        g.get_string("tokenizer.chat_template", ""));
  } catch (const Error& e) {
    fail("Tokenizer::from_gguf: ", file, ": ", e.what());
  }
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GGUFFile& g) {
  const std::string& file = g.path();
  const std::string model = g.get_string("tokenizer.ggml.model");
  PA_CHECK(model == "gpt2" || model == "llama", "Tokenizer::from_gguf: ", file,
           ": key 'tokenizer.ggml.model': unsupported tokenizer model '", model,
           "' (byte-level BPE 'gpt2' or SentencePiece BPE 'llama')");
  const GGUFValue& tokens = g.get("tokenizer.ggml.tokens");
  PA_CHECK(tokens.type == GGUFType::array && tokens.array_type == GGUFType::string &&
               !tokens.strings.empty(),
           "Tokenizer::from_gguf: ", file, ": key 'tokenizer.ggml.tokens' must be a string array");
  const size_t n = tokens.strings.size();
  std::vector<TokenType> types(n, TokenType::normal);
  if (const GGUFValue* tt = g.find("tokenizer.ggml.token_type")) {
    PA_CHECK(tt->type == GGUFType::array && tt->ints.size() == n, "Tokenizer::from_gguf: ", file,
             ": key 'tokenizer.ggml.token_type' must be an integer array of ", n, " entries");
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = tt->ints[i];
      PA_CHECK(v >= 1 && v <= 6, "Tokenizer::from_gguf: ", file,
               ": key 'tokenizer.ggml.token_type': entry ", i, " has unknown type ", v);
      types[i] = TokenType(v);
    }
  }
  if (model == "llama") return sentencepiece_from_gguf(g, tokens.strings, std::move(types));
  std::vector<std::string> merges;
  if (const GGUFValue* m = g.find("tokenizer.ggml.merges")) {
    PA_CHECK(m->type == GGUFType::array && m->array_type == GGUFType::string, "Tokenizer::from_gguf: ",
             file, ": key 'tokenizer.ggml.merges' must be a string array");
    merges = m->strings;
  }
  const PreTokenizer pre = parse_pre_tokenizer(g.get_string("tokenizer.ggml.pre", "default"));
  auto id_of = [&](const char* key) {
    const int64_t id = g.get_int(key, -1);
    PA_CHECK(id >= -1 && id < int64_t(n), "Tokenizer::from_gguf: ", file, ": key '", key, "' = ", id,
             " is outside the vocabulary of ", n);
    return int32_t(id);
  };
  const int32_t bos = id_of("tokenizer.ggml.bos_token_id");
  const int32_t eos = id_of("tokenizer.ggml.eos_token_id");
  const int32_t eot = id_of("tokenizer.ggml.eot_token_id");
  const int32_t eom = id_of("tokenizer.ggml.eom_token_id");
  Tokenizer t;
  try {
    t = from_parts(tokens.strings, merges, std::move(types), pre, bos, eos,
                   g.get_bool("tokenizer.ggml.add_bos_token", false),
                   g.get_string("tokenizer.chat_template", ""));
  } catch (const Error& e) {
    fail("Tokenizer::from_gguf: ", file, ": ", e.what());
  }
  TokenizerLoader::set_extras(t, pre == PreTokenizer::llama3, {eot, eom});
  return t;
}

namespace {

json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  PA_CHECK(in, "Tokenizer::from_tokenizer_json: cannot open ", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("Tokenizer::from_tokenizer_json: ", p.string(), ": not valid JSON: ", e.what());
  }
}

// NOTE: json::value() throws nlohmann's type_error for a field of another type (or a holder that
// is not an object); these raise Error naming the file and the key instead.
void check_holder(const json& j, const char* key, const std::string& file) {
  PA_CHECK(j.is_object(), "Tokenizer::from_tokenizer_json: ", file, ": expected an object with key '",
           key, "', got ", j.dump().substr(0, 100));
}
std::string str_field(const json& j, const char* key, const std::string& dflt,
                      const std::string& file) {
  check_holder(j, key, file);
  if (!j.contains(key) || j[key].is_null()) return dflt;
  PA_CHECK(j[key].is_string(), "Tokenizer::from_tokenizer_json: ", file, ": key '", key,
           "' must be a string, got ", j[key].dump().substr(0, 100));
  return j[key].get<std::string>();
}
bool bool_field(const json& j, const char* key, bool dflt, const std::string& file) {
  check_holder(j, key, file);
  if (!j.contains(key) || j[key].is_null()) return dflt;
  PA_CHECK(j[key].is_boolean(), "Tokenizer::from_tokenizer_json: ", file, ": key '", key,
           "' must be true or false, got ", j[key].dump().substr(0, 100));
  return j[key].get<bool>();
}

// "bos_token": "<s>" or {"content": "<s>", ...}
std::string token_content(const json& j, const char* key) {
  if (!j.contains(key)) return "";
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

PreTokenizer detect_pre(const json& pre, const std::string& file) {
  PA_CHECK(!pre.is_null(), "Tokenizer::from_tokenizer_json: ", file,
           ": key 'pre_tokenizer' is null (byte-level BPE needs one)");
  const std::string s = pre.dump();
  if (s.find("\\\\p{N}{1,3}") != std::string::npos) return PreTokenizer::llama3;
  if (s.find("(?i:'s") != std::string::npos) return PreTokenizer::qwen2;
  if (s.find("\"Digits\"") != std::string::npos) return PreTokenizer::smollm;
  if (s.find("\"ByteLevel\"") != std::string::npos) return PreTokenizer::gpt2;
  fail("Tokenizer::from_tokenizer_json: ", file, ": key 'pre_tokenizer': unsupported pre-tokenizer ",
       s.substr(0, 200));
}

// The parts of a "Sequence" (or the one object) of a normalizer, pre-tokenizer or decoder.
std::vector<json> sequence_parts(const json& j, const char* list_key, const std::string& file) {
  if (j.is_null()) return {};
  if (str_field(j, "type", "", file) == "Sequence") {
    PA_CHECK(j.contains(list_key) && j[list_key].is_array(), "Tokenizer::from_tokenizer_json: ",
             file, ": a Sequence needs an array '", list_key, "'");
    return j[list_key].get<std::vector<json>>();
  }
  return {j};
}

// SentencePiece BPE in a tokenizer.json ("byte_fallback": true, as transformers converts Llama 2
// and Mistral): the text is prepared either by the legacy normalizer (Prepend U+2581 to every
// stretch between special tokens, Replace " " by U+2581) or by a Metaspace pre-tokenizer
// (replacement U+2581, prepend_scheme always / first / never, split or not); anything else is
// refused by name.
TokenizerLoader::SpmJson spm_json_options(const json& j, const std::string& file) {
  const std::string sp = "\xE2\x96\x81";
  TokenizerLoader::SpmJson o;
  bool replaces_spaces = false;
  for (const json& n : sequence_parts(j.value("normalizer", json()), "normalizers", file)) {
    const std::string type = str_field(n, "type", "", file);
    if (type == "Prepend" && str_field(n, "prepend", "", file) == sp) {
      o.prefix = true;
    } else if (type == "Replace" && n.contains("pattern") && n["pattern"].is_object() &&
               str_field(n["pattern"], "String", "", file) == " " &&
               str_field(n, "content", "", file) == sp) {
      replaces_spaces = true;
    } else {
      fail("Tokenizer::from_tokenizer_json: ", file, ": key 'normalizer': unsupported with byte "
           "fallback: ", n.dump().substr(0, 200));
    }
  }
  for (const json& p : sequence_parts(j.value("pre_tokenizer", json()), "pretokenizers", file)) {
    PA_CHECK(str_field(p, "type", "", file) == "Metaspace" &&
                 str_field(p, "replacement", sp, file) == sp,
             "Tokenizer::from_tokenizer_json: ", file, ": key 'pre_tokenizer': unsupported with "
             "byte fallback: ", p.dump().substr(0, 200));
    PA_CHECK(!o.prefix && !replaces_spaces, "Tokenizer::from_tokenizer_json: ", file,
             ": both a normalizer and a Metaspace pre-tokenizer put U+2581 in the text");
    replaces_spaces = true;
    // Older files say "add_prefix_space"; newer ones "prepend_scheme".
    const std::string scheme = str_field(
        p, "prepend_scheme", bool_field(p, "add_prefix_space", true, file) ? "always" : "never",
        file);
    PA_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
             "Tokenizer::from_tokenizer_json: ", file,
             ": key 'pre_tokenizer.prepend_scheme': unknown value '", scheme, "'");
    o.prefix = scheme != "never";
    o.prefix_first = scheme == "first";
    o.prefix_if_no_space = true;
    o.split = bool_field(p, "split", true, file);
  }
  PA_CHECK(replaces_spaces, "Tokenizer::from_tokenizer_json: ", file,
           ": byte fallback without a Replace normalizer or Metaspace pre-tokenizer (spaces would "
           "not become U+2581)");
  // The decoder takes the prefix's space off again: a Strip of one leading space, or Metaspace's.
  for (const json& d : sequence_parts(j.value("decoder", json()), "decoders", file)) {
    const std::string type = str_field(d, "type", "", file);
    if (type == "Strip" && d.contains("start") && d["start"].is_number_integer() &&
        d["start"].get<int64_t>() > 0)
      o.strip_first_piece = true;
    if (type == "Metaspace" &&
        str_field(d, "prepend_scheme", bool_field(d, "add_prefix_space", true, file) ? "always"
                                                                                    : "never",
                  file) != "never")
      o.strip_first_piece = true;
  }
  return o;
}

// "<0x0A>"
bool is_byte_piece(const std::string& s) {
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' &&
         std::isxdigit(uint8_t(s[3])) && std::isxdigit(uint8_t(s[4]));
}

}  // namespace

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path) {
  const json j = read_json(path);
  PA_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
           "Tokenizer::from_tokenizer_json: ", path, ": key 'model' missing");
  const json& m = j["model"];
  PA_CHECK(str_field(m, "type", "BPE", path) == "BPE", "Tokenizer::from_tokenizer_json: ", path,
           ": key 'model.type': only BPE is supported");
  const bool byte_fallback = bool_field(m, "byte_fallback", false, path);
  PA_CHECK(m.contains("vocab") && m["vocab"].is_object(), "Tokenizer::from_tokenizer_json: ", path,
           ": key 'model.vocab' must be an object");

  // Ids may have gaps until the added tokens fill them.
  int64_t n = 0;
  for (const auto& [text, id] : m["vocab"].items()) {
    PA_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 24),
             "Tokenizer::from_tokenizer_json: ", path, ": key 'model.vocab': token '", text,
             "' has id ", id.dump());
    n = std::max(n, id.get<int64_t>() + 1);
  }
  const json added = j.value("added_tokens", json::array());
  PA_CHECK(added.is_array(), "Tokenizer::from_tokenizer_json: ", path, ": key 'added_tokens' must be an array");
  for (const auto& a : added) {
    PA_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() &&
                 a["id"].get<int64_t>() >= 0 && a["id"].get<int64_t>() < (1 << 24) &&
                 a.contains("content") && a["content"].is_string(),
             "Tokenizer::from_tokenizer_json: ", path, ": key 'added_tokens': bad entry ", a.dump());
    n = std::max(n, a["id"].get<int64_t>() + 1);
  }
  std::vector<std::string> vocab(static_cast<size_t>(n));
  std::vector<TokenType> types(static_cast<size_t>(n), TokenType::unused);
  for (const auto& [text, id] : m["vocab"].items()) {
    vocab[size_t(id.get<int64_t>())] = text;
    types[size_t(id.get<int64_t>())] = TokenType::normal;
  }
  for (const auto& a : added) {
    const size_t id = size_t(a["id"].get<int64_t>());
    vocab[id] = a["content"].get<std::string>();
    types[id] = bool_field(a, "special", false, path) ? TokenType::control : TokenType::user_defined;
  }
  std::vector<std::string> merges;
  for (const auto& mg : m.value("merges", json::array())) {
    if (mg.is_string()) merges.push_back(mg.get<std::string>());
    else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string())
      merges.push_back(mg[0].get<std::string>() + " " + mg[1].get<std::string>());
    else fail("Tokenizer::from_tokenizer_json: ", path, ": key 'model.merges': bad entry ", mg.dump());
  }
  TokenizerLoader::SpmJson spm;
  if (byte_fallback) {
    spm = spm_json_options(j, path);
    for (size_t i = 0; i < vocab.size(); ++i)
      if (types[i] == TokenType::normal && is_byte_piece(vocab[i])) types[i] = TokenType::byte;
  }
  const PreTokenizer pre =
      byte_fallback ? PreTokenizer::gpt2 : detect_pre(j.value("pre_tokenizer", json()), path);

  // tokenizer_config.json: bos/eos, add_bos_token, chat_template.
  json cfg = json::object();
  const fs::path cfg_path = fs::path(path).parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg_path)) cfg = read_json(cfg_path);
  auto find_id = [&](const std::string& s) -> int32_t {
    for (size_t i = 0; i < vocab.size(); ++i)
      if (vocab[i] == s && types[i] != TokenType::unused) return int32_t(i);
    return -1;
  };
  int32_t bos = find_id(token_content(cfg, "bos_token"));
  const int32_t eos = find_id(token_content(cfg, "eos_token"));
  bool add_bos = bool_field(cfg, "add_bos_token", false, path);
  // A post-processor that prepends a special token adds BOS (Llama 3).
  if (j.contains("post_processor") && j["post_processor"].is_object()) {
    const json& pp = j["post_processor"];
    const json* tp = &pp;
    if (str_field(pp, "type", "", path) == "Sequence" && pp.contains("processors"))
      for (const auto& p : pp["processors"])
        if (str_field(p, "type", "", path) == "TemplateProcessing") tp = &p;
    if (str_field(*tp, "type", "", path) == "TemplateProcessing" && tp->contains("single") &&
        (*tp)["single"].is_array() && !(*tp)["single"].empty() &&
        (*tp)["single"][0].contains("SpecialToken")) {
      const int32_t id = find_id(str_field((*tp)["single"][0]["SpecialToken"], "id", "", path));
      if (id >= 0) {
        add_bos = true;
        bos = id;
      }
    }
  }
  std::string tmpl;
  if (cfg.contains("chat_template")) {
    const json& ct = cfg["chat_template"];
    if (ct.is_string()) tmpl = ct.get<std::string>();
    else if (ct.is_array())
      for (const auto& e : ct)
        if (str_field(e, "name", "", path) == "default") tmpl = str_field(e, "template", "", path);
  }
  Tokenizer t;
  try {
    if (byte_fallback) {
      const std::string unk = str_field(m, "unk_token", "", path);
      spm.unk = unk.empty() ? -1 : find_id(unk);
      t = from_sentencepiece(std::move(vocab), {}, std::move(types), bos, eos, add_bos,
                             spm.prefix, tmpl);
      TokenizerLoader::set_spm_json(t, merges, spm);
      return t;
    }
    t = from_parts(std::move(vocab), merges, std::move(types), pre, bos, eos, add_bos, tmpl);
  } catch (const Error& e) {
    fail("Tokenizer::from_tokenizer_json: ", path, ": ", e.what());
  }
  TokenizerLoader::set_extras(t, bool_field(m, "ignore_merges", false, path), {});
  return t;
}

Tokenizer load_tokenizer(const std::string& path) {
  PA_CHECK(fs::exists(path), "load_tokenizer: ", path, " does not exist");
  if (fs::is_directory(path)) {
    const fs::path tj = fs::path(path) / "tokenizer.json";
    PA_CHECK(fs::exists(tj), "load_tokenizer: ", path, ": no tokenizer.json in the folder");
    return Tokenizer::from_tokenizer_json(tj.string());
  }
  if (fs::path(path).extension() == ".json") return Tokenizer::from_tokenizer_json(path);
  return Tokenizer::from_gguf(GGUFFile::open(path));
}

}  // namespace pagedattn
