// Beam search and best_of on top of KvCache::fork.
//
// A beam whose last token is computed parks its top continuations (log-softmax of its logits) and
// waits, computing nothing, until every live beam of its request has its own; then one beam step
// ranks all continuations by cumulative logprob and keeps the best width. A beam kept once takes
// its token; a beam kept k times forks k - 1 children first (its pages shared, never copied; the
// shared tail page is copied on the first write); a beam not kept is freed at once. A beam ending
// in eos, a stop token, a stop string or max_tokens moves to the finished list (its pages freed).
// The search ends when no beam is live, or early once width beams are finished and no live beam
// scores above the worst of them (length penalty applied at the live beams' current length).
#include <algorithm>

#include "beam_search.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"
#include "request_state.h"

namespace pagedattn {

namespace {

using Seqs = std::vector<std::unique_ptr<Sequence>>;

std::vector<Sequence *> live_beams(const Seqs &seqs) {
  std::vector<Sequence *> live;
  for (auto &s : seqs)
    if (!s->finished()) live.push_back(s.get());
  return live;
}

double seq_score(const Request &req, const Sequence &s) {
  return req.use_beam_search
             ? beam::score(s.cumulative_logprob, s.num_generated(), double(req.length_penalty))
             : s.cumulative_logprob;
}

// Finished sequences, best first (ties: lower index).
std::vector<Sequence *> ranked(const Request &req, const Seqs &seqs) {
  std::vector<Sequence *> out;
  for (auto &s : seqs)
    if (s->finished()) out.push_back(s.get());
  std::stable_sort(out.begin(), out.end(), [&](const Sequence *a, const Sequence *b) {
    const double sa = seq_score(req, *a), sb = seq_score(req, *b);
    return sa != sb ? sa > sb : a->index < b->index;
  });
  return out;
}

}  // namespace

Sequence *Engine::fork_beam(RequestState &rs, Sequence &parent) {
  PA_ASSERT(parent.cache_seq >= 0);
  auto child = std::make_unique<Sequence>(parent);  // tokens, text state, logprob
  child->index = rs.next_index++;
  child->order = rs.base_order + uint64_t(child->index);
  child->cache_seq = cache_->fork(parent.cache_seq);  // shares every page of the history
  rs.last_token.resize(std::max(rs.last_token.size(), size_t(child->index) + 1));
  rs.last_token[size_t(child->index)] = rs.last_token[size_t(parent.index)];  // for the ITL
  scheduler_->add_running(child.get());
  rs.seqs.push_back(std::move(child));
  return rs.seqs.back().get();
}

void Engine::drop_seq(RequestState &rs, Sequence *seq) {
  scheduler_->remove(seq);  // frees its pages now
  rs.beam_pending.erase(seq);
  auto it = std::find_if(rs.seqs.begin(), rs.seqs.end(),
                         [&](const std::unique_ptr<Sequence> &p) { return p.get() == seq; });
  PA_ASSERT(it != rs.seqs.end());
  rs.seqs.erase(it);
}

void Engine::beam_step(RequestState &rs) {
  const std::vector<Sequence *> live = live_beams(rs.seqs);
  if (live.empty()) return;
  for (Sequence *s : live)
    if (!rs.beam_pending.count(s)) return;  // a sibling is still computing
  const int32_t width = rs.req.width();

  std::vector<beam::Candidate> cands;
  for (size_t b = 0; b < live.size(); ++b)
    for (const beam::TokenLogprob &t : rs.beam_pending.at(live[b]))
      cands.push_back({int32_t(b), t.token, live[b]->cumulative_logprob + t.logprob});
  rs.beam_pending.clear();
  auto ends = [&](int32_t token) {
    const bool eos =
        !rs.req.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
    return eos || live[0]->sampler.is_stop_token(token);
  };
  const std::vector<beam::Candidate> kept = beam::select(std::move(cands), width, ends);

  // Forks first (they copy the parent's history before it grows), then frees, then appends.
  std::vector<int32_t> uses(live.size(), 0);
  std::vector<Sequence *> target(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    Sequence &parent = *live[size_t(kept[i].beam)];
    target[i] = uses[size_t(kept[i].beam)]++ == 0 ? &parent : fork_beam(rs, parent);
  }
  for (size_t b = 0; b < live.size(); ++b)
    if (uses[b] == 0) drop_seq(rs, live[b]);
  for (size_t i = 0; i < kept.size(); ++i) {
    target[i]->cumulative_logprob = kept[i].cum_logprob;
    append_token(rs, *target[i], kept[i].token);
  }

  // Early stop: width beams finished and none of the live ones can still beat the worst of them.
  const std::vector<Sequence *> done = ranked(rs.req, rs.seqs);
  const std::vector<Sequence *> still = live_beams(rs.seqs);
  if (int32_t(done.size()) >= width && !still.empty()) {
    const double worst = seq_score(rs.req, *done[size_t(width) - 1]);
    bool hopeless = true;
    for (const Sequence *s : still) hopeless = hopeless && seq_score(rs.req, *s) < worst;
    if (hopeless)
      for (Sequence *s : still) drop_seq(rs, s);
  }
}

void Engine::run_beam_steps(const SchedulerOutput &out, std::vector<RequestId> &touched) {
  // NOTE: a beam parked with its continuations holds its pages but is never scheduled; when
  // nothing at all could be scheduled, a sibling is waiting for pages the parked beams hold. Fail
  // those requests rather than hang.
  if (out.empty() && out.out_of_memory.empty() && scheduler_->has_work()) {
    for (auto &[id, rs] : requests_)
      if (rs->req.use_beam_search && !rs->beam_pending.empty())
        cancel(id, "beam search: the KV cache cannot hold every beam of the request at once");
  }
  std::vector<RequestId> ids = touched;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (RequestId id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end() || !it->second->req.use_beam_search || it->second->cancelled)
      continue;
    beam_step(*it->second);
  }
}

RequestOutput Engine::collect_held(RequestState &rs) {
  RequestOutput o;
  o.id = rs.id;
  o.prompt_tokens = int32_t(rs.req.prompt.size());
  o.cached_tokens = std::max(rs.cached_tokens, 0);
  bool all_finished = true;
  for (auto &s : rs.seqs) {
    o.completion_tokens += s->num_generated();
    all_finished = all_finished && s->finished();
  }
  // best_of: every candidate exists once the prompt's sequence forked (a prompt that the cache
  // cannot hold finishes before it forks).
  const bool complete = rs.req.use_beam_search || rs.cancelled ||
                        (rs.seqs.size() == 1 && !rs.seqs[0]->forked) ||
                        int32_t(rs.seqs.size()) == rs.req.num_sequences();
  if (!all_finished || !complete) return o;
  const std::vector<Sequence *> best = ranked(rs.req, rs.seqs);
  o.completion_tokens = 0;
  for (size_t i = 0; i < best.size() && int32_t(i) < rs.req.n; ++i) {
    Sequence &s = *best[i];
    SequenceOutput so;
    so.index = int32_t(i);
    so.new_tokens.assign(s.tokens.begin() + s.prompt_len, s.tokens.end());
    so.new_text = std::move(s.new_text);
    s.new_text.clear();
    so.finish = s.finish;
    so.cumulative_logprob = s.cumulative_logprob;
    so.logprobs = std::move(s.new_logprobs);
    s.new_logprobs.clear();
    o.completion_tokens += s.num_generated();
    o.seqs.push_back(std::move(so));
  }
  o.finished = true;
  o.error = rs.error;
  return o;
}

}  // namespace pagedattn
