// `pagedattn logits`: raw logits of a batch of token-id prompts, prefilled together and decoded
// greedily together through the engine (Request::return_logits), for parity checks against another
// implementation (scripts/device/hf_parity.py).
//
// For each sequence, rows are the logits at every prompt position, then one row after each
// generated token: with P prompt ids and N decode steps, P + N rows for the P + N tokens of
// prompt_ids + generated_ids, row i predicting token i + 1. With --decode-ids the decode steps
// feed those ids instead of the greedy choice (teacher forcing: logits compared with another
// implementation's along the same tokens, even where a near tie flips a greedy choice);
// generated_ids still reports this model's greedy choices.
#include <climits>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "model_session.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"
#include "pagedattn/sampling.h"

namespace pagedattn::tools {

namespace {

struct LogitsArgs {
  SessionOptions session;
  std::string prompt_ids;  // "1,2,3;4,5": sequences separated by ';'
  std::string decode_ids;  // same form; empty: greedy
  int32_t decode_steps = 8;
  bool json = false;
};

std::vector<std::vector<int32_t>> parse_ids(const std::string& text, const char* flag) {
  std::vector<std::vector<int32_t>> out;
  std::stringstream seqs(text);
  std::string seq;
  while (std::getline(seqs, seq, ';')) {
    std::vector<int32_t> ids;
    std::stringstream items(seq);
    std::string item;
    while (std::getline(items, item, ',')) {
      if (item.find_first_not_of(" \t") == std::string::npos) continue;
      size_t used = 0;
      long v = -1;
      try {
        v = std::stol(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      PA_CHECK(used > 0 && item.find_first_not_of(" \t", used) == std::string::npos,
               "logits: ", flag, " has '", item, "', not an integer");
      PA_CHECK(v >= 0 && v <= INT32_MAX, "logits: ", flag, " has ", v, ", not a token id");
      ids.push_back(int32_t(v));
    }
    PA_CHECK(!ids.empty(), "logits: ", flag, " has an empty sequence (sequence ", out.size(),
             ")");
    out.push_back(std::move(ids));
  }
  PA_CHECK(!out.empty(), "logits: ", flag, " is empty");
  return out;
}


void write_ids(std::FILE* f, const std::vector<int32_t>& ids) {
  std::fputc('[', f);
  for (size_t i = 0; i < ids.size(); ++i) std::fprintf(f, "%s%d", i ? "," : "", ids[i]);
  std::fputc(']', f);
}

void run_logits(const LogitsArgs& a) {
  PA_CHECK(a.decode_steps >= 0, "logits: --decode-steps must be >= 0, got ", a.decode_steps);
  const std::vector<std::vector<int32_t>> prompts = parse_ids(a.prompt_ids, "--prompt-ids");
  std::vector<std::vector<int32_t>> forced;
  if (!a.decode_ids.empty()) {
    forced = parse_ids(a.decode_ids, "--decode-ids");
    PA_CHECK(forced.size() == prompts.size(), "logits: --decode-ids has ", forced.size(),
             " sequences, --prompt-ids ", prompts.size());
    for (size_t s = 0; s < forced.size(); ++s) {
      PA_CHECK(int64_t(forced[s].size()) >= a.decode_steps, "logits: --decode-ids sequence ", s,
               " has ", forced[s].size(), " ids, fewer than --decode-steps ", a.decode_steps);
    }
  }
  SessionOptions so = a.session;
  so.quiet = a.json;
  so.kv_tokens = 0;  // every sequence's tokens, each rounded up to whole pages
  for (const auto& p : prompts) {
    so.kv_tokens +=
        (int64_t(p.size()) + a.decode_steps + so.page_size) / so.page_size * so.page_size;
  }
  EngineConfig ec;
  ec.enable_prefix_cache = false;
  ec.max_num_seqs = int32_t(prompts.size());
  EngineSession m = open_engine(so, ec);
  const int64_t V = m.config().vocab_size;
  // Each sequence is one request that returns the logits of every position: its P prompt rows,
  // then one per decode step. N decode steps feed N tokens: the request samples N + 1 (the last
  // one's row is the P + N-th) and ignores eos, so every sequence runs them all.
  std::vector<Request> reqs;
  for (size_t s = 0; s < prompts.size(); ++s) {
    Request r;
    r.prompt = prompts[s];
    r.sampling.temperature = 0.f;
    r.max_tokens = a.decode_steps + 1;
    r.ignore_eos = true;
    r.return_logits = true;
    if (!forced.empty())
      r.forced_tokens.assign(forced[s].begin(), forced[s].begin() + a.decode_steps);
    reqs.push_back(std::move(r));
  }
  const std::vector<RequestOutput> outs = m.engine->generate(std::move(reqs));
  std::vector<std::vector<std::vector<float>>> rows(prompts.size());
  std::vector<std::vector<int32_t>> generated(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    const RequestOutput& o = outs[s];
    PA_CHECK(o.error.empty() && o.seqs.size() == 1, "logits: sequence ", s, " failed: ", o.error);
    const std::vector<float>& flat = o.seqs[0].logits;
    const size_t n = flat.size() / size_t(V);
    PA_CHECK(n == prompts[s].size() + size_t(a.decode_steps), "logits: sequence ", s, " got ", n,
             " logit rows, not ", prompts[s].size() + size_t(a.decode_steps),
             " (the context ends before the decode steps do)");
    for (size_t i = 0; i < n; ++i) {
      rows[s].emplace_back(flat.begin() + ptrdiff_t(i * size_t(V)),
                           flat.begin() + ptrdiff_t((i + 1) * size_t(V)));
    }
    // This model's greedy choice after each of the first N rows that end in a decode step.
    for (int32_t step = 0; step < a.decode_steps; ++step)
      generated[s].push_back(argmax(rows[s][prompts[s].size() - 1 + size_t(step)]));
  }
  if (!a.json) {
    for (size_t s = 0; s < prompts.size(); ++s) {
      std::printf("sequence %zu: prompt ", s);
      write_ids(stdout, prompts[s]);
      std::printf(" generated ");
      write_ids(stdout, generated[s]);
      std::printf("\n");
    }
    return;
  }
  std::printf("{\"model\":\"%s\",\"device\":\"%s\",\"vocab_size\":%lld,\"sequences\":[",
              a.session.model.c_str(), device_name(m.engine->model().device()).c_str(),
              static_cast<long long>(V));
  for (size_t s = 0; s < prompts.size(); ++s) {
    std::printf("%s{\"prompt_ids\":", s ? "," : "");
    write_ids(stdout, prompts[s]);
    std::printf(",\"generated_ids\":");
    write_ids(stdout, generated[s]);
    std::printf(",\"logits\":[");
    for (size_t i = 0; i < rows[s].size(); ++i) {
      std::printf("%s[", i ? "," : "");
      for (int64_t j = 0; j < V; ++j) std::printf("%s%.9g", j ? "," : "", rows[s][i][size_t(j)]);
      std::printf("]");
    }
    std::printf("]}");
  }
  std::printf("]}\n");
}

}  // namespace

void register_logits(CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* cmd = app.add_subcommand(
      "logits", "Logits of token-id prompts, prefilled and greedily decoded as one batch");
  cmd->add_option("--prompt-ids", args->prompt_ids,
                  "Token ids, comma-separated; sequences separated by ';' (e.g. \"1,2,3;4,5\")")
      ->required();
  cmd->add_option("--decode-steps", args->decode_steps, "Greedy decode steps after the prefill")
      ->capture_default_str();
  cmd->add_option("--decode-ids", args->decode_ids,
                  "Feed these ids at the decode steps instead of the greedy choice (same form as "
                  "--prompt-ids, at least --decode-steps per sequence)");
  cmd->add_flag("--json", args->json, "Print every logit row as JSON");
  add_session_options(*cmd, args->session);
  cmd->callback([args] {
    run_logits(*args);
    set_exit_code(0);
  });
}

}  // namespace pagedattn::tools
