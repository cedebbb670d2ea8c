// The token-budget scheduler (see scheduler.h for the policy).
#include "scheduler.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <unordered_set>

#include "pagedattn/error.h"

namespace pagedattn {

AdmissionPolicy parse_admission_policy(const std::string &name) {
  if (name == "lookahead") return AdmissionPolicy::lookahead;
  if (name == "immediate") return AdmissionPolicy::immediate;
  fail("admission: expected lookahead or immediate, got '", name, "'");
}

PreemptionMode parse_preemption_mode(const std::string &name) {
  if (name == "auto") return PreemptionMode::cheaper;
  if (name == "recompute") return PreemptionMode::recompute;
  if (name == "swap") return PreemptionMode::swap;
  fail("preemption mode: expected auto, recompute or swap, got '", name, "'");
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The copy rate assumed until a MiB has been swapped: a PCIe 4.0 x16 link's practical rate, and
// well below a memcpy's on the CPU.
constexpr double kAssumedCopyBytesPerS = 8e9;

}  // namespace

Scheduler::Scheduler(const SchedulerConfig &config, KvCache &cache)
    : config_(config), cache_(cache) {
  PA_CHECK(config.max_num_batched_tokens >= 1,
           "Scheduler: max_num_batched_tokens must be >= 1, got ", config.max_num_batched_tokens);
  PA_CHECK(config.max_num_seqs >= 1, "Scheduler: max_num_seqs must be >= 1, got ",
           config.max_num_seqs);
  const int32_t num_pages = cache.config().num_pages;
  PA_CHECK(config.swap_space_bytes >= 0, "Scheduler: swap_space_bytes must be >= 0, got ",
           config.swap_space_bytes);
  PA_CHECK(config.watermark_pages < num_pages, "Scheduler: watermark_pages (",
           config.watermark_pages, ") must be below the pool's ", num_pages, " pages");
  watermark_ = config.watermark_pages >= 0 ? config.watermark_pages : num_pages / 100;
}

void Scheduler::add_waiting(Sequence *seq) {
  PA_CHECK(seq != nullptr, "Scheduler::add_waiting: seq is null");
  PA_CHECK(seq->cache_seq < 0, "Scheduler::add_waiting: seq already holds cache state");
  PA_CHECK(seq->num_tokens() >= 1, "Scheduler::add_waiting: seq has no tokens");
  // NOTE: whether a prompt fits is the engine's check (Engine::validate); one that cannot fit
  // anyway comes out of schedule() as out_of_memory.
  PA_CHECK(!waiting_.count(seq->order) && !running_.count(seq->order),
           "Scheduler::add_waiting: order ", seq->order, " already queued");
  seq->num_computed = 0;
  waiting_[seq->order] = seq;
}

void Scheduler::add_running(Sequence *seq) {
  PA_CHECK(seq != nullptr && seq->cache_seq >= 0,
           "Scheduler::add_running: seq holds no cache state");
  PA_CHECK(!waiting_.count(seq->order) && !running_.count(seq->order),
           "Scheduler::add_running: order ", seq->order, " already queued");
  running_[seq->order] = seq;
}

void Scheduler::remove(Sequence *seq) {
  if (seq->finish == FinishReason::stop || seq->finish == FinishReason::length)
    output_lengths_.observe(seq->num_generated());
  drop_swapped(*seq);
  auto w = waiting_.find(seq->order);
  if (w != waiting_.end() && w->second == seq) waiting_.erase(w);
  auto r = running_.find(seq->order);
  if (r != running_.end() && r->second == seq) running_.erase(r);
  if (seq->cache_seq >= 0) {
    cache_.free_sequence(seq->cache_seq);
    seq->cache_seq = -1;
  }
}

int32_t Scheduler::available_pages() const { return cache_.num_available_pages(); }

void Scheduler::preempt(Sequence *seq, SchedulerOutput &out) {
  preempted_computed_ += seq->num_computed;
  bool swapped = false;
  if (should_swap(*seq)) {
    const Clock::time_point t0 = Clock::now();
    try {
      seq->swapped = cache_.swap_out(seq->cache_seq);
      swapped = true;
    } catch (const Error &) {
      // NOTE: no host memory to be had (or the copy failed): swap_out changed nothing, recompute.
    }
    if (swapped) {
      swap_.seconds += seconds_since(t0);
      swap_.pin_seconds += seq->swapped->pin_seconds;
      swap_.out_bytes += int64_t(seq->swapped->bytes);
      swap_.used_bytes += int64_t(seq->swapped->bytes);
      swap_.tokens += seq->num_computed;
      ++swap_.preemptions;
      ++swap_.swapped_now;
    }
  }
  if (!swapped) {
    // Its full pages go back to the prefix cache (deepest first, so the LRU evicts them before
    // their parents) and serve its re-admission if they are still there.
    seq->recompute_until = std::max(seq->recompute_until, seq->num_computed);
    cache_.free_sequence(seq->cache_seq);
  }
  seq->cache_seq = -1;
  seq->num_computed = 0;
  running_.erase(seq->order);
  waiting_[seq->order] = seq;
  ++num_preemptions_;
  out.preempted.push_back(seq);
}

bool Scheduler::should_swap(const Sequence &seq) const {
  if (config_.preemption == PreemptionMode::recompute || config_.swap_space_bytes <= 0) return false;
  // NOTE: a tensor-parallel cache replays its page copies on the other ranks' pools; swap is not
  // among them.
  if (cache_.config().record_page_copies) return false;
  // NOTE: a beam waiting for its siblings has nothing left to compute; its step's logits are lost
  // with the preemption, and only computing its last token again brings them back.
  if (seq.num_computed == 0 || seq.num_uncomputed() == 0) return false;
  const int64_t bytes = int64_t(cache_.swap_bytes(seq.num_computed));
  if (swap_.used_bytes + bytes > config_.swap_space_bytes) return false;
  if (config_.preemption == PreemptionMode::swap) return true;
  // cheaper: out and back in at the copy rate seen so far, against a prefill of the same tokens.
  if (prefill_s_per_token_ <= 0) return true;  // no prefill measured yet: the copies, far cheaper
  // NOTE: the copy rate leaves out the time taken to pin host memory: that is paid once, when the
  // swap space is first used, and then kept (at the first swaps of an H100 run it made the copies
  // look 10x slower than they are, and recompute was chosen for good).
  const double copied = double(swap_.out_bytes + swap_.in_bytes);
  const double copy_s = swap_.seconds - swap_.pin_seconds;
  const double rate =
      copied >= double(1 << 20) && copy_s > 0 ? copied / copy_s : kAssumedCopyBytesPerS;
  return 2.0 * double(bytes) / rate < double(seq.num_computed) * prefill_s_per_token_;
}

void Scheduler::drop_swapped(Sequence &seq) {
  if (!seq.swapped) return;
  swap_.used_bytes -= int64_t(seq.swapped->bytes);
  --swap_.swapped_now;
  seq.swapped.reset();
}

void Scheduler::observe_step(const SchedulerOutput &out, double seconds) {
  // NOTE: a step of a few prefill tokens measures the step's fixed cost, not the prefill rate.
  if (out.num_prefill_tokens < 64 || !(seconds > 0)) return;
  const double s = seconds / double(out.num_prefill_tokens + out.num_decode_tokens);
  prefill_s_per_token_ = prefill_s_per_token_ > 0 ? 0.8 * prefill_s_per_token_ + 0.2 * s : s;
}

int32_t Scheduler::tokens_that_fit(const Sequence &seq, int32_t want, int32_t available) const {
  int32_t lo = 0, hi = want;  // pages_needed is monotone in n
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (cache_.pages_needed(seq.cache_seq, mid) <= available)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

void Scheduler::append(Sequence *seq, int32_t n, SchedulerOutput &out) {
  ForwardBatch &b = out.batch;
  if (b.q_indptr.empty()) b.q_indptr.push_back(0);
  const int32_t start = seq->num_computed;
  const bool is_decode = n == 1 && seq->num_uncomputed() == 1 && seq->num_generated() > 0;
  std::span<const int32_t> toks(seq->tokens.data() + start, size_t(n));
  const std::vector<int32_t> slots = cache_.append_slots(seq->cache_seq, toks);
  b.seqs.push_back(seq->cache_seq);
  for (int32_t i = 0; i < n; ++i) {
    b.tokens.push_back(toks[size_t(i)]);
    b.positions.push_back(start + i);
    b.slots.push_back(slots[size_t(i)]);
  }
  b.q_indptr.push_back(int32_t(b.tokens.size()));
  ScheduledSeq s{seq, n, -1};
  if (seq->all_logit_rows) {
    s.first_logit_row = int32_t(b.logit_rows.size());
    for (int32_t i = n; i >= 1; --i) b.logit_rows.push_back(int32_t(b.tokens.size()) - i);
    if (start + n == seq->num_tokens()) s.logit_row = int32_t(b.logit_rows.size()) - 1;
  } else if (start + n == seq->num_tokens()) {
    s.logit_row = int32_t(b.logit_rows.size());
    b.logit_rows.push_back(int32_t(b.tokens.size()) - 1);
  }
  (is_decode ? out.num_decode_tokens : out.num_prefill_tokens) += n;
  out.scheduled.push_back(s);
}

GrowthForecast Scheduler::forecast(const Sequence &seq) const {
  GrowthForecast f;
  f.num_tokens = seq.num_tokens();
  if (seq.cache_seq >= 0) {
    const std::span<const int32_t> table = cache_.block_table(seq.cache_seq);
    f.held_pages = int32_t(table.size());
    for (int32_t page : table) f.freed_pages += cache_.refcount(page) == 1;
  }
  if (seq.max_length <= 0) {  // end unknown: it keeps what it will hold after this step, forever
    f.final_kv = f.num_tokens;
    f.steps_left = std::numeric_limits<int32_t>::max();
    return f;
  }
  int32_t final_len = seq.max_length;
  if (!seq.exact_length) {
    const int32_t max_out = std::max(seq.max_length - seq.prompt_len, 0);
    final_len = seq.prompt_len + output_lengths_.estimate(seq.num_generated(), max_out);
  }
  // NOTE: the last token is sampled, never computed: the cache holds final_len - 1 positions.
  f.steps_left = std::max(1, final_len - f.num_tokens);
  f.final_kv = std::max(f.num_tokens, final_len - 1);
  return f;
}

bool Scheduler::forecast_fits(const Sequence &candidate) const {
  std::vector<GrowthForecast> fs;
  fs.reserve(running_.size() + 1);
  bool estimated = !candidate.exact_length;
  for (const auto &[order, s] : running_) {
    fs.push_back(forecast(*s));
    estimated = estimated || !s->exact_length;
  }
  fs.push_back(forecast(candidate));
  const int32_t num_pages = cache_.config().num_pages;
  const int64_t used = num_pages - available_pages();
  // NOTE: exact forecasts need no margin; estimated ones keep the watermark for their misses.
  const int64_t limit = num_pages - (estimated ? watermark_ : 0);
  return pagedattn::forecast_peak_pages(fs, cache_.config().page_size, used) <= limit;
}

int64_t Scheduler::forecast_peak_pages() const {
  std::vector<GrowthForecast> fs;
  for (const auto &[order, s] : running_) fs.push_back(forecast(*s));
  return pagedattn::forecast_peak_pages(fs, cache_.config().page_size,
                                        cache_.config().num_pages - available_pages());
}

Sequence *Scheduler::pick_victim(const Sequence *self,
                                 const std::unordered_set<const Sequence *> &scheduled) {
  Sequence *best = nullptr;
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {  // newest first
    Sequence *s = it->second;
    if (s == self || scheduled.count(s)) continue;
    if (config_.victim == VictimPolicy::newest) return s;
    // least_work: the fewest computed tokens lost; among equals the newest (seen first).
    if (!best || s->num_computed < best->num_computed) best = s;
  }
  return best;
}

bool Scheduler::admitted_alone(const SchedulerOutput &out) const {
  return out.scheduled.empty() &&
         std::none_of(running_.begin(), running_.end(),
                      [](const auto &r) { return r.second->num_uncomputed() > 0; });
}

// Admits the oldest waiting sequence if its first chunk fits; returns false
// when it must wait.
bool Scheduler::admit_one(int32_t &budget, SchedulerOutput &out) {
  Sequence *seq = waiting_.begin()->second;
  if (seq->swapped) return admit_swapped(budget, out);
  const SeqId cs = cache_.create_sequence(seq->cache_salt);
  int32_t reused = 0;
  // NOTE: the cache counts the lookup (KvCacheStats): a preempted sequence coming back counts
  // apart, what it reuses of its own computed tokens.
  if (config_.enable_prefix_cache)
    reused = cache_.attach_prefix(cs, seq->tokens, std::max(seq->recompute_until, 0));
  int32_t n = std::min(seq->num_tokens() - reused, budget);
  const int32_t available = available_pages();
  const bool alone = admitted_alone(out);
  const bool lookahead = config_.admission == AdmissionPolicy::lookahead;
  // NOTE: with the lookahead the forecast below keeps the room that the running batch will need.
  const int32_t reserve = alone || lookahead ? 0 : watermark_;
  seq->cache_seq = cs;
  const bool fits_now = cache_.pages_needed(cs, n) + reserve <= available;
  if (fits_now && lookahead && !alone && !forecast_fits(*seq)) {
    cache_.free_sequence(cs);
    seq->cache_seq = -1;
    ++admission_stalls_;
    return false;
  }
  if (!fits_now) {
    const int32_t fit = alone ? tokens_that_fit(*seq, n, available) : 0;
    if (fit == 0) {
      cache_.free_sequence(cs);
      seq->cache_seq = -1;
      if (!alone) {
        ++admission_stalls_;
        return false;
      }
      // The whole cache cannot hold it: give up on it rather than wait forever.
      waiting_.erase(waiting_.begin());
      out.out_of_memory.push_back(seq);
      return true;
    }
    n = fit;
  }
  waiting_.erase(waiting_.begin());
  seq->num_computed = reused;
  running_[seq->order] = seq;
  append(seq, n, out);
  budget -= n;
  return true;
}

bool Scheduler::admit_swapped(int32_t &budget, SchedulerOutput &out) {
  Sequence *seq = waiting_.begin()->second;
  const SwappedKv &kv = *seq->swapped;
  const int32_t kv_len = kv.kv_len(), ps = cache_.config().page_size;
  const int32_t n = std::min(seq->num_tokens() - kv_len, budget);
  PA_ASSERT(n >= 1);
  const int32_t pages =
      cache_.swap_in_pages(kv) + (kv_len + n + ps - 1) / ps - (kv_len + ps - 1) / ps;
  const int32_t available = available_pages();
  const bool alone = admitted_alone(out);
  const bool lookahead = config_.admission == AdmissionPolicy::lookahead;
  const int32_t reserve = alone || lookahead ? 0 : watermark_;
  auto recompute_instead = [&] {
    drop_swapped(*seq);
    seq->recompute_until = std::max(seq->recompute_until, kv_len);
    return admit_one(budget, out);
  };
  if (pages + reserve > available || (lookahead && !alone && !forecast_fits(*seq))) {
    // Alone and still too large to come back whole: recompute it a chunk at a time.
    if (alone) return recompute_instead();
    ++admission_stalls_;
    return false;
  }
  const Clock::time_point t0 = Clock::now();
  SeqId cs = -1;
  try {
    cs = cache_.swap_in(kv);
  } catch (const Error &) {
    return recompute_instead();  // NOTE: swap_in changed nothing
  }
  swap_.seconds += seconds_since(t0);
  swap_.in_bytes += int64_t(kv.bytes);
  drop_swapped(*seq);
  seq->cache_seq = cs;
  seq->num_computed = kv_len;
  waiting_.erase(waiting_.begin());
  running_[seq->order] = seq;
  append(seq, n, out);
  budget -= n;
  return true;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.batch.q_indptr.push_back(0);
  int32_t budget = config_.max_num_batched_tokens;
  std::unordered_set<const Sequence *> scheduled;

  std::vector<Sequence *> decodes, prefills;
  for (auto &[order, s] : running_) {
    if (s->num_uncomputed() == 0) continue;  // a beam waiting for its siblings' step
    (s->num_uncomputed() == 1 ? decodes : prefills).push_back(s);
  }

  auto schedule_running = [&](Sequence *s, bool is_decode) {
    if (!running_.count(s->order)) return;  // preempted earlier in this step
    if (budget == 0 || int32_t(scheduled.size()) >= config_.max_num_seqs) return;
    const int32_t want = std::min(s->num_uncomputed(), budget);
    int32_t n = want;
    for (;;) {
      const int32_t available = available_pages();
      if (cache_.pages_needed(s->cache_seq, n) <= available) break;
      if (!is_decode) {
        const int32_t fit = tokens_that_fit(*s, want, available);
        if (fit > 0) {
          n = fit;
          break;
        }
      }
      if (Sequence *victim = pick_victim(s, scheduled)) {
        preempt(victim, out);
        n = want;
        continue;
      }
      if (out.scheduled.empty()) {
        // It holds every page in use and still cannot grow.
        running_.erase(s->order);
        cache_.free_sequence(s->cache_seq);
        s->cache_seq = -1;
        out.out_of_memory.push_back(s);
      } else {
        preempt(s, out);
      }
      return;
    }
    append(s, n, out);
    scheduled.insert(s);
    budget -= n;
  };

  auto admit_waiting = [&] {
    while (!waiting_.empty() && budget > 0 && int32_t(running_.size()) < config_.max_num_seqs &&
           int32_t(out.scheduled.size()) < config_.max_num_seqs) {
      if (!admit_one(budget, out)) break;
    }
  };
  if (config_.prefill_first) {
    for (Sequence *s : prefills) schedule_running(s, false);
    admit_waiting();
    // NOTE: decodes run when no prefill could, so a waiting request held back for pages never
    // stalls the running ones.
    if (out.scheduled.empty())
      for (Sequence *s : decodes) schedule_running(s, true);
  } else {
    for (Sequence *s : decodes) schedule_running(s, true);
    for (Sequence *s : prefills) schedule_running(s, false);
    admit_waiting();
  }
  if (out.scheduled.empty()) out.batch.q_indptr.assign(1, 0);
  set_attention_layout(out.batch, cache_);  // after every append: the runners read it, not the cache
  return out;
}

void Scheduler::commit(const SchedulerOutput &out, bool written) {
  for (const ScheduledSeq &s : out.scheduled) {
    if (s.seq->cache_seq < 0) continue;  // finished or cancelled while its pass ran
    const int32_t start = s.seq->num_computed;
    recomputed_tokens_ += std::clamp(s.seq->recompute_until - start, 0, s.num_tokens);
    s.seq->num_computed += s.num_tokens;
    if (written) cache_.commit(s.seq->cache_seq, s.seq->num_computed);
  }
}

}  // namespace pagedattn
