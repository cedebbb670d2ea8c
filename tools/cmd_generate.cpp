// `pagedattn generate` and `pagedattn chat`: one request through the engine, its text streamed to
// stdout, with prefill and decode speeds on stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "model_session.h"
#include "pagedattn/chat_template.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"
#include "pagedattn/sampling.h"

namespace pagedattn::tools {

namespace {

struct GenerateArgs {
  SessionOptions session;
  std::string prompt;
  std::string system;
  bool chat = false;
  int32_t max_tokens = 256;
  SamplingParams sampling;
  bool raw = false;  // generate: no chat template even for instruct models
};

void add_sampling_options(CLI::App& cmd, GenerateArgs& a) {
  a.sampling.temperature = 0.f;
  cmd.add_option("--max-tokens", a.max_tokens, "Tokens to generate at most")->capture_default_str();
  cmd.add_option("--temperature", a.sampling.temperature, "0: greedy")->capture_default_str();
  cmd.add_option("--top-p", a.sampling.top_p, "Nucleus sampling mass (1: off)")
      ->capture_default_str();
  cmd.add_option("--top-k", a.sampling.top_k, "Keep the k most likely tokens (0: off)")
      ->capture_default_str();
  cmd.add_option("--min-p", a.sampling.min_p, "Drop tokens below min_p x the top probability")
      ->capture_default_str();
  cmd.add_option("--repetition-penalty", a.sampling.repetition_penalty, "1: off")
      ->capture_default_str();
  cmd.add_option("--seed", a.sampling.seed, "Sampling seed")->capture_default_str();
  cmd.add_option("--stop", a.sampling.stop, "Stop string (repeatable)");
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct TurnStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_s = 0, decode_s = 0;
};

// Runs one request of `prompt` through the engine, streaming its text to stdout as it comes.
// Returns the generated text (stop string trimmed). The prompt's prefill (the tokens the prefix
// cache did not hold) is timed up to the first token; the rest is decode. A token that ends
// generation (end of turn, a stop id) is not counted.
std::string run_turn(Engine& engine, const std::vector<int32_t>& prompt, const GenerateArgs& a,
                     TurnStats& st) {
  Request req;
  req.prompt = prompt;
  req.sampling = a.sampling;
  req.seed = a.sampling.seed;
  req.max_tokens = a.max_tokens;
  const RequestId id = engine.add_request(std::move(req));  // validates: throws, nothing queued
  std::string text;
  std::vector<int32_t> generated;
  FinishReason finish = FinishReason::none;
  auto t0 = std::chrono::steady_clock::now();
  bool first = true;
  int32_t cached = 0;  // prompt tokens the prefix cache held (chat: the earlier turns)
  while (engine.has_work()) {
    for (const RequestOutput& o : engine.step()) {
      if (o.id != id) continue;
      PA_CHECK(o.error.empty(), "generate: ", o.error);
      cached = o.cached_tokens;
      for (const SequenceOutput& so : o.seqs) {
        if (first && !so.new_tokens.empty()) {
          st.prefill_s += since(t0);
          t0 = std::chrono::steady_clock::now();
          first = false;
        }
        generated.insert(generated.end(), so.new_tokens.begin(), so.new_tokens.end());
        if (!so.new_text.empty()) {
          text += so.new_text;
          std::fwrite(so.new_text.data(), 1, so.new_text.size(), stdout);
          std::fflush(stdout);
        }
        if (so.finish != FinishReason::none) finish = so.finish;
      }
    }
  }
  st.prefill_tokens += int64_t(prompt.size()) - cached;
  st.decode_s += since(t0);
  // NOTE: the engine keeps the token that ended generation (an end-of-turn id, a stop id); the
  // stats count the tokens shown, as they always have.
  if (finish == FinishReason::stop && !generated.empty() &&
      engine.is_stop_token(generated.back(), a.sampling.stop_token_ids))
    generated.pop_back();
  st.decode_tokens += int64_t(generated.size());
  return text;
}

void print_stats(const TurnStats& st) {
  // NOTE: the first decode token comes from the prefill's logits, so decode speed counts the
  // forward steps after it (generated - 1) over the decode time.
  const double pre = st.prefill_s > 0 ? double(st.prefill_tokens) / st.prefill_s : 0;
  const double dec =
      st.decode_s > 0 ? double(std::max<int64_t>(st.decode_tokens - 1, 0)) / st.decode_s : 0;
  std::fprintf(
      stderr,
      "\nprefill: %lld tokens in %.3f s (%.1f tok/s); decode: %lld tokens in %.3f s (%.1f tok/s)\n",
      static_cast<long long>(st.prefill_tokens), st.prefill_s, pre,
      static_cast<long long>(st.decode_tokens), st.decode_s, dec);
}

void run_generate(const GenerateArgs& a) {
  validate_sampling_params(a.sampling);
  PA_CHECK(a.max_tokens > 0, "generate: --max-tokens must be positive, got ", a.max_tokens);
  require_tokenizer(a.session.model, "generate");
  // Tokenize with the tokenizer alone first, so the cache can be sized to the job.
  const Tokenizer tok = load_tokenizer(a.session.model);
  std::vector<int32_t> ids;
  if (a.chat) {
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", a.prompt});
    ids = encode_chat(tok, msgs, true);
  } else {
    ids = tok.encode(a.prompt, true, false);
  }
  PA_CHECK(!ids.empty(), "generate: --prompt encodes to no tokens");
  SessionOptions so = a.session;
  so.kv_tokens = int64_t(ids.size()) + a.max_tokens + 1;
  EngineConfig ec;
  ec.enable_prefix_cache = false;  // one request: nothing to share
  EngineSession m = open_engine(so, ec);
  TurnStats st;
  run_turn(*m.engine, ids, a, st);
  print_stats(st);
}

// Reads user turns from stdin until EOF or /exit; /reset starts a new conversation. Each turn is a
// request of the whole conversation so far; the prefix cache keeps the pages of the earlier turns,
// so a turn prefills little more than its new tokens.
void run_chat(const GenerateArgs& a) {
  validate_sampling_params(a.sampling);
  require_tokenizer(a.session.model, "chat");
  EngineConfig ec;
  ec.enable_prefix_cache = true;
  ec.max_num_seqs = 1;
  EngineSession m = open_engine(a.session, ec);
  const Tokenizer& tok = m.tok();
  std::vector<ChatMessage> msgs;
  if (!a.system.empty()) msgs.push_back({"system", a.system});
  const size_t first_turn = msgs.size();
  std::string line;
  std::cerr << "chat: type a message; /reset starts over, /exit or end of input quits\n";
  for (;;) {
    std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      msgs.resize(first_turn);
      continue;
    }
    msgs.push_back({"user", line});
    const std::vector<int32_t> ids = encode_chat(tok, msgs, true);
    TurnStats st;
    try {
      const std::string reply = run_turn(*m.engine, ids, a, st);
      msgs.push_back({"assistant", reply});
    } catch (const Error& e) {
      // A full context: say so and keep the session usable.
      std::cerr << "\nchat: " << e.what() << " (use /reset)\n";
      msgs.pop_back();
      continue;
    }
    std::fputc('\n', stdout);
    print_stats(st);
  }
}

}  // namespace

void register_generate(CLI::App& app, CLI::App& bench) {
  auto gen = std::make_shared<GenerateArgs>();
  CLI::App* g = app.add_subcommand("generate", "Generate a continuation of a prompt");
  g->add_option("--prompt", gen->prompt, "The prompt text")->required();
  g->add_flag("--chat", gen->chat, "Wrap the prompt in the model's chat template");
  g->add_option("--system", gen->system, "System message (with --chat)");
  add_session_options(*g, gen->session);
  add_sampling_options(*g, *gen);
  g->callback([gen] {
    run_generate(*gen);
    set_exit_code(0);
  });

  auto chat = std::make_shared<GenerateArgs>();
  CLI::App* c = app.add_subcommand("chat", "Chat with the model on stdin/stdout");
  c->add_option("--system", chat->system, "System message");
  c->add_option("--max-context", chat->session.kv_tokens, "Tokens the conversation may hold")
      ->capture_default_str();
  add_session_options(*c, chat->session);
  add_sampling_options(*c, *chat);
  c->callback([chat] {
    chat->chat = true;
    run_chat(*chat);
    set_exit_code(0);
  });

  register_logits(app);
  register_bench_model(bench);
}

}  // namespace pagedattn::tools
