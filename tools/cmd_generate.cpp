// `pagedattn generate` and `pagedattn chat`: one sequence through the paged cache, streamed to
// stdout, with prefill and decode speeds on stderr.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "model_session.h"
#include "pagedattn/chat_template.h"
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

// Prefills `new_tokens` onto seq (which already holds `history` minus those), then samples and
// streams up to max_tokens. Returns the generated text (stop string trimmed); the sampled tokens
// are appended to history (the final stop token is not fed to the cache).
std::string run_turn(ModelSession& m, SeqId seq, const std::vector<int32_t>& new_tokens,
                     std::vector<int32_t>& history, const GenerateArgs& a, TurnStats& st) {
  const Tokenizer& tok = m.tokenizer();
  const int64_t limit =
      std::min<int64_t>(m.config().max_position_embeddings,
                        int64_t(m.cache().config().num_pages) * m.cache().config().page_size);
  PA_CHECK(m.cache().kv_len(seq) + int64_t(new_tokens.size()) < limit, "generate: the prompt (",
           m.cache().kv_len(seq) + int64_t(new_tokens.size()),
           " tokens) does not fit the context of ", limit, " tokens");
  SamplingParams sp = a.sampling;
  const std::vector<int32_t> eog = m.stop_ids();
  sp.stop_token_ids.insert(sp.stop_token_ids.end(), eog.begin(), eog.end());
  Sampler sampler(sp);
  StreamDecoder decoder(tok, /*skip_special=*/true);
  StopStringMatcher matcher(sp.stop);
  std::string text;
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    text += piece;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };

  auto t0 = std::chrono::steady_clock::now();
  Tensor logits = m.prefill({seq}, {new_tokens});
  st.prefill_s += since(t0);
  st.prefill_tokens += int64_t(new_tokens.size());
  t0 = std::chrono::steady_clock::now();
  // Plain greedy (Sampler::sample's argmax): the decode steps pick the token on the model's device
  // and download only its id.
  const bool greedy = sp.temperature == 0.f && sp.repetition_penalty == 1.f;
  int32_t next = sampler.sample(
      std::span<const float>(logits.data_as<float>(), size_t(logits.dim(1))), history);
  int64_t generated = 0;
  for (int32_t i = 0; i < a.max_tokens; ++i) {
    if (sampler.is_stop_token(next)) break;
    history.push_back(next);
    ++generated;
    emit(matcher.feed(decoder.push(next)));
    if (matcher.stopped() || i + 1 == a.max_tokens || m.cache().kv_len(seq) + 1 >= limit) break;
    if (greedy) {
      next = m.decode_greedy({seq}, {next}).at(0);
    } else {
      logits = m.decode({seq}, {next});
      next = sampler.sample(std::span<const float>(logits.data_as<float>(), size_t(logits.dim(1))),
                            history);
    }
  }
  if (!matcher.stopped()) {
    emit(matcher.feed(decoder.flush()));
    emit(matcher.flush());
  }
  st.decode_s += since(t0);
  st.decode_tokens += generated;
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

SessionOptions sized(SessionOptions s, int64_t tokens) {
  s.kv_tokens = tokens;
  return s;
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
  ModelSession m(sized(a.session, int64_t(ids.size()) + a.max_tokens + 1));
  const SeqId seq = m.cache().create_sequence();
  std::vector<int32_t> history = ids;
  TurnStats st;
  run_turn(m, seq, ids, history, a, st);
  print_stats(st);
}

// Reads user turns from stdin until EOF or /exit; /reset starts a new conversation. The cache keeps
// the conversation: each turn prefills only the tokens after what it already holds.
void run_chat(const GenerateArgs& a) {
  validate_sampling_params(a.sampling);
  require_tokenizer(a.session.model, "chat");
  ModelSession m(a.session);
  const Tokenizer& tok = m.tokenizer();
  std::vector<ChatMessage> msgs;
  if (!a.system.empty()) msgs.push_back({"system", a.system});
  const size_t first_turn = msgs.size();
  SeqId seq = m.cache().create_sequence();
  std::vector<int32_t> history;
  std::string line;
  std::cerr << "chat: type a message; /reset starts over, /exit or end of input quits\n";
  for (;;) {
    std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      msgs.resize(first_turn);
      m.cache().free_sequence(seq);
      seq = m.cache().create_sequence();
      history.clear();
      continue;
    }
    msgs.push_back({"user", line});
    const std::vector<int32_t> ids = encode_chat(tok, msgs, true);
    // Reuse the cached conversation when it is a prefix of the new rendering, else start over.
    const auto cached = m.cache().tokens(seq);
    const bool prefix =
        cached.size() < ids.size() && std::equal(cached.begin(), cached.end(), ids.begin());
    if (!prefix) {
      m.cache().free_sequence(seq);
      seq = m.cache().create_sequence();
    }
    const size_t keep = prefix ? cached.size() : 0;
    const std::vector<int32_t> fresh(ids.begin() + ptrdiff_t(keep), ids.end());
    history = ids;
    TurnStats st;
    try {
      const std::string reply = run_turn(m, seq, fresh, history, a, st);
      msgs.push_back({"assistant", reply});
    } catch (const Error& e) {
      // A full context: say so and keep the session usable.
      std::cerr << "\nchat: " << e.what() << " (use /reset)\n";
      msgs.pop_back();
      m.cache().free_sequence(seq);
      seq = m.cache().create_sequence();
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
