// The serving benchmark's replay loop: arrivals -> (static batcher) -> Engine::step -> per-token
// timestamps and KV samples -> RunResult.
#include "serve_bench_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>

#include "pagedattn/error.h"
#include "sampling_mix.h"
#include "static_baseline.h"

namespace pagedattn::bench::serve_bench {

namespace {

using Clock = std::chrono::steady_clock;

// One request's timeline, in seconds from the start of the run.
struct Track {
  double arrival = -1;  // -1: not released yet (tokens-target mode)
  double first = -1, last = -1, done = -1;
  int32_t generated = 0;
  bool submitted = false;
};

// Time-weighted mean of a piecewise-constant series (value i holds from t[i] to t[i+1]).
template <class F>
double time_mean(const std::vector<KvSample>& s, double end, F value) {
  double area = 0, span = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const double dt = (i + 1 < s.size() ? s[i + 1].t : end) - s[i].t;
    area += dt * double(value(s[i]));
    span += dt;
  }
  return span > 0 ? area / span : 0.0;
}

}  // namespace

void print_progress(const std::string& label, int32_t done, int32_t total, int64_t tokens, double t,
                    bool final) {
  constexpr int kWidth = 30;
  const int fill = total > 0 ? int(double(kWidth) * done / total) : 0;
  std::string bar(size_t(fill), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %d/%d requests, %lld tokens, %.1f s%s", label.c_str(),
               bar.c_str(), done, total, (long long)tokens, t, final ? "\n" : "");
  std::fflush(stderr);
}

void summarize_run(RunResult& r, const std::vector<double>& ttft, const std::vector<double>& tpot,
                   const std::vector<double>& itl, const std::vector<double>& e2e,
                   double first_done, double last_backlog) {
  r.req_per_s = r.completed / r.duration_s;
  r.output_tok_per_s = double(r.output_tokens) / r.duration_s;
  r.total_tok_per_s = double(r.output_tokens + r.prompt_tokens) / r.duration_s;
  r.ttft_s = summarize(ttft);
  r.tpot_s = summarize(tpot);
  r.itl_s = summarize(itl);
  r.e2e_s = summarize(e2e);
  r.ramp_s = std::max(first_done, 0.0);
  const double tail_start = std::max(last_backlog, r.ramp_s);
  r.tail_s = r.duration_s - tail_start;
  r.steady_s = tail_start - r.ramp_s;
  if (r.steady_s > 0) {
    auto tokens_at = [&](double t) {  // cumulative output tokens at time t
      int64_t n = 0;
      for (const KvSample& s : r.timeline) {
        if (s.t > t) break;
        n = s.output_tokens;
      }
      return n;
    };
    r.steady_output_tok_per_s = double(tokens_at(tail_start) - tokens_at(r.ramp_s)) / r.steady_s;
  }
  if (r.timeline.empty()) {  // nothing known about the KV cache
    r.kv_allocated_mean = r.kv_live_mean = r.kv_waste_frac = r.running_mean = kAbsent;
    r.kv_allocated_max = r.running_max = -1;
    return;
  }
  r.kv_allocated_mean =
      time_mean(r.timeline, r.duration_s, [](const KvSample& s) { return s.kv_allocated; });
  const bool live_known = std::all_of(r.timeline.begin(), r.timeline.end(),
                                      [](const KvSample& s) { return s.kv_live >= 0; });
  if (live_known) {
    r.kv_live_mean =
        time_mean(r.timeline, r.duration_s, [](const KvSample& s) { return s.kv_live; });
    r.kv_waste_frac = r.kv_allocated_mean > 0 ? 1.0 - r.kv_live_mean / r.kv_allocated_mean : 0.0;
  } else {
    r.kv_live_mean = r.kv_waste_frac = kAbsent;
  }
  r.running_mean = time_mean(r.timeline, r.duration_s, [](const KvSample& s) { return s.running; });
  for (const KvSample& s : r.timeline) {
    r.kv_allocated_max = std::max(r.kv_allocated_max, s.kv_allocated);
    r.running_max = std::max(r.running_max, s.running);
  }
}

RunResult run_serve_bench(const ModelFile& file, const std::vector<WorkItem>& work,
                          const WorkloadSpec& spec, const RunConfig& cfg) {
  return run_serve_bench([&file] { return create_model(file, Device::cpu); }, work, spec, cfg);
}

RunResult run_serve_bench(const ModelFactory& make_model, const std::vector<WorkItem>& work,
                          const WorkloadSpec& spec, const RunConfig& cfg) {
  PA_CHECK(cfg.mode == "paged" || cfg.mode == "static", "bench serve: --mode must be paged or ",
           "static, got '", cfg.mode, "'");
  PA_CHECK(cfg.sampling == "greedy" || cfg.sampling == "mixed",
           "bench serve: --sampling must be greedy or mixed, got '", cfg.sampling, "'");
  PA_CHECK(cfg.kv_budget_tokens > 0, "bench serve: --kv-tokens must be positive, got ",
           cfg.kv_budget_tokens);
  PA_CHECK(cfg.target_tokens >= 0 && cfg.concurrency > 0,
           "bench serve: --target-tokens must be >= 0 and --concurrency positive");
  PA_CHECK(!work.empty(), "bench serve: the workload is empty");
  const bool is_static = cfg.mode == "static";
  const bool closed_loop = cfg.target_tokens > 0;

  EngineConfig ec;
  ec.page_size = cfg.page_size;
  ec.max_num_seqs = cfg.max_num_seqs;
  ec.max_num_batched_tokens = cfg.max_num_batched_tokens;
  ec.log_startup = false;
  if (is_static) {
    // NOTE: the baseline's memory is kv_budget_tokens of contiguous regions; the paged engine that
    // executes its batches gets one extra page per sequence so that page rounding never makes a
    // batch that fits the budget preempt (the run reports preemptions, which must stay 0).
    ec.kv_cache_tokens = cfg.kv_budget_tokens + int64_t(cfg.max_num_seqs) * cfg.page_size;
    ec.watermark_pages = 0;
    ec.enable_prefix_cache = false;
    // NOTE: the baseline's batches always fit; the admission before the lookahead keeps its
    // executor exactly what it was.
    ec.admission = AdmissionPolicy::immediate;
    ec.victim = VictimPolicy::newest;
    ec.swap_space_mib = 0;  // nothing to preempt
  } else {
    ec.kv_cache_tokens = cfg.kv_budget_tokens;
    ec.enable_prefix_cache = cfg.prefix_cache;
    ec.admission = parse_admission_policy(cfg.admission);
    ec.preemption = parse_preemption_mode(cfg.preemption);
    ec.swap_space_mib = cfg.swap_space_mib;
    ec.reserve_swap_space = true;  // as `pagedattn serve`, before the run's clock starts
    ec.victim = ec.admission == AdmissionPolicy::lookahead ? VictimPolicy::least_work
                                                           : VictimPolicy::newest;
  }
  Engine engine(make_model(), ec);
  for (size_t i = 0; i < work.size(); ++i) {
    const int64_t len = int64_t(work[i].prompt.size()) + work[i].max_tokens;
    PA_CHECK(len <= engine.max_model_len(), "bench serve: request ", i, " needs ", len,
             " tokens, beyond the model's max_model_len ", engine.max_model_len());
    PA_CHECK(len <= cfg.kv_budget_tokens, "bench serve: request ", i, " needs ", len,
             " tokens of KV, more than --kv-tokens ", cfg.kv_budget_tokens);
  }

  RunResult r;
  r.config = cfg;
  r.workload = spec;
  r.kv_pool_tokens = engine.kv_capacity_tokens();
  std::vector<Track> tr(work.size());
  std::map<RequestId, size_t> by_id;
  StaticBatcher batcher(cfg.kv_budget_tokens, cfg.max_num_seqs, cfg.batch_timeout_s);
  std::vector<double> ttft, tpot, itl, e2e;
  const std::string label = cfg.mode +
                            (is_static          ? ""
                             : cfg.prefix_cache ? "+prefix"
                                                : "") +
                            (is_static || cfg.admission == "lookahead" ? "" : "+" + cfg.admission) +
                            (is_static || cfg.preemption == "auto" ? "" : "+" + cfg.preemption) +
                            " rate=" + (closed_loop ? std::string("closed") : [&] {
                              char b[32];
                              std::snprintf(b, sizeof b, "%g", spec.rate);
                              return std::string(b);
                            }());

  const double busy0 = engine.model().device_busy_seconds();
  const Model::GraphStats graphs0 = engine.model().cuda_graph_stats();
  const Clock::time_point t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  size_t next = 0;                    // next request to arrive
  int32_t completed = 0, active = 0;  // active: arrived, not finished
  int64_t issued_tokens = 0;          // closed loop: output tokens asked for so far
  double first_done = -1, last_backlog = 0, last_progress = -1;

  auto submit = [&](size_t i) {
    Request req;
    req.prompt = work[i].prompt;
    req.max_tokens = work[i].max_tokens;
    req.ignore_eos = true;
    req.sampling.temperature = 0;  // greedy
    if (cfg.sampling == "mixed") {
      req.sampling = mixed_sampling();
      req.seed = uint64_t(i);
    }
    by_id[engine.add_request(std::move(req))] = i;
    tr[i].submitted = true;
  };
  auto arrive = [&](size_t i, double now) {
    tr[i].arrival = closed_loop ? now : work[i].arrival_s;
    ++active;
    issued_tokens += work[i].max_tokens;
    if (is_static)
      batcher.push(i, static_reservation(int64_t(work[i].prompt.size()), work[i].max_tokens),
                   tr[i].arrival);
    else
      submit(i);
  };
  auto more_to_come = [&] {
    return next < work.size() && (!closed_loop || issued_tokens < cfg.target_tokens);
  };

  // Records the KV state at time now (after each step, and when it changes between steps).
  auto sample = [&](double now) -> const KvSample& {
    const KvCacheStats st = engine.cache().stats();
    KvSample s;
    s.t = now;
    s.running = engine.num_running();
    s.waiting = engine.num_waiting() + int32_t(batcher.queued());
    s.kv_live = int64_t(st.pages_used) * cfg.page_size - st.tail_slots_wasted;
    s.kv_allocated = is_static ? batcher.reserved_tokens() : int64_t(st.pages_used) * cfg.page_size;
    s.output_tokens = r.output_tokens;
    r.timeline.push_back(s);
    return r.timeline.back();
  };
  auto changed = [&] {
    if (r.timeline.empty()) return true;
    const KvSample& b = r.timeline.back();
    const KvCacheStats st = engine.cache().stats();
    return b.kv_allocated !=
               (is_static ? batcher.reserved_tokens() : int64_t(st.pages_used) * cfg.page_size) ||
           b.waiting != engine.num_waiting() + int32_t(batcher.queued());
  };

  while (true) {
    double now = elapsed();
    if (closed_loop) {
      while (more_to_come() && active < cfg.concurrency) arrive(next++, now);
    } else {
      while (next < work.size() && work[next].arrival_s <= now) arrive(next++, now);
    }
    if (!more_to_come() && active == 0) {
      if (is_static) batcher.finish_batch();
      sample(now);  // the end state: nothing held
      break;
    }
    if (is_static && engine.num_active_requests() == 0) {
      if (batcher.running()) {
        batcher.finish_batch();
        sample(now);
      }
      for (size_t i : batcher.launch(now, more_to_come())) submit(i);
    }
    if (!engine.has_work()) {  // idle: sleep until the next arrival or batch deadline
      if (changed()) sample(now);
      double wake = is_static ? batcher.deadline() : 1e300;
      if (!closed_loop && next < work.size()) wake = std::min(wake, work[next].arrival_s);
      const double dt = std::clamp(wake - now, 0.0, 0.05);
      if (dt > 0) std::this_thread::sleep_for(std::chrono::duration<double>(dt));
      continue;
    }
    const std::vector<RequestOutput> outs = engine.step();
    now = elapsed();
    for (const RequestOutput& o : outs) {
      const auto it = by_id.find(o.id);
      PA_ASSERT(it != by_id.end());
      Track& t = tr[it->second];
      PA_CHECK(o.error.empty(), "bench serve: request ", it->second, " failed: ", o.error);
      for (const SequenceOutput& s : o.seqs) {
        for (size_t k = 0; k < s.new_tokens.size(); ++k) {
          if (t.first < 0) {
            t.first = now;
            ttft.push_back(now - t.arrival);
          } else {
            itl.push_back(now - t.last);
          }
          t.last = now;
          ++t.generated;
          ++r.output_tokens;
        }
      }
      if (o.finished) {
        t.done = now;
        --active;
        ++completed;
        if (first_done < 0) first_done = now;
        e2e.push_back(now - t.arrival);
        if (t.generated > 1) tpot.push_back((t.last - t.first) / double(t.generated - 1));
        r.prompt_tokens += int64_t(work[it->second].prompt.size());
      }
    }
    const KvSample& s = sample(now);
    if (more_to_come() || s.waiting > 0) last_backlog = now;
    if (cfg.progress && (now - last_progress > 0.25)) {
      last_progress = now;
      print_progress(label, completed, closed_loop ? int32_t(next) : int32_t(work.size()),
                     r.output_tokens, now, false);
    }
  }
  r.duration_s = elapsed();
  r.schedule_ahead = engine.schedules_ahead() ? 1 : 0;
  if (busy0 >= 0) {
    r.device_busy_s = engine.model().device_busy_seconds() - busy0;
    r.device_idle_frac = std::max(0.0, 1.0 - r.device_busy_s / r.duration_s);
  }
  if (cfg.progress)
    print_progress(label, completed, completed, r.output_tokens, r.duration_s, true);

  r.completed = completed;
  summarize_run(r, ttft, tpot, itl, e2e, first_done, last_backlog);
  for (size_t i = 0; i < next; ++i) {
    RequestRecord q;
    q.arrival_s = tr[i].arrival;
    q.prompt_tokens = int32_t(work[i].prompt.size());
    q.max_tokens = work[i].max_tokens;
    q.output_tokens = tr[i].generated;
    if (tr[i].first >= 0) q.ttft_s = tr[i].first - tr[i].arrival;
    if (tr[i].done >= 0) q.e2e_s = tr[i].done - tr[i].arrival;
    r.requests.push_back(q);
  }
  const EngineMetrics m = engine.metrics();
  r.preemptions = m.preemptions;
  r.preemptions_recompute = m.preemptions_recompute;
  r.recomputed_tokens = m.recomputed_tokens;
  r.preemptions_swap = m.preemptions_swap;
  r.swapped_tokens = m.swapped_tokens;
  r.swap_bytes = m.swap_out_bytes + m.swap_in_bytes;
  r.swap_s = m.swap_seconds;
  r.swap_pin_s = m.swap_pin_seconds;
  r.preempted_computed_tokens = m.preempted_computed_tokens;
  r.resumed_prefix_hit_tokens = m.resumed_prefix_hit_tokens;
  r.admission_stalls = m.admission_stalls;
  if (graphs0.captures >= 0) {
    const Model::GraphStats g = engine.model().cuda_graph_stats();
    r.graph_captures = g.captures - graphs0.captures;
    r.graph_replays = g.replays - graphs0.replays;
  }
  r.steps = m.steps;
  r.output_tokens_per_step = r.steps > 0 ? double(r.output_tokens) / double(r.steps) : 0.0;
  if (!std::isnan(r.device_busy_s) && r.steps > 0)
    r.device_idle_ms_per_step = 1e3 * std::max(0.0, r.duration_s - r.device_busy_s) / r.steps;
  r.prefix_hit_rate = m.prefix_hit_rate();  // the cache's one count
  return r;
}

}  // namespace pagedattn::bench::serve_bench
