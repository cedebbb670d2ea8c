// /metrics: the engine's counters in the Prometheus text format.
#include <iomanip>
#include <sstream>

#include "pagedattn/server.h"

namespace pagedattn {

namespace {

void metric(std::ostringstream& os, const char* name, const char* type, const char* help,
            const std::string& labels, double value) {
  os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
     << name << labels << ' ' << value << '\n';
}

void histogram(std::ostringstream& os, const char* name, const char* help,
               const std::string& model_label, const Histogram& h) {
  os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
  int64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cum += h.counts[i];
    os << name << "_bucket{" << model_label << ",le=\"" << h.bounds[i] << "\"} " << cum << '\n';
  }
  os << name << "_bucket{" << model_label << ",le=\"+Inf\"} " << h.count << '\n';
  os << name << "_sum{" << model_label << "} " << h.sum << '\n';
  os << name << "_count{" << model_label << "} " << h.count << '\n';
}

}  // namespace

std::string prometheus_text(const EngineMetrics& m, const std::string& model_name) {
  std::string escaped;
  for (char c : model_name) {
    if (c == '\\' || c == '"') escaped.push_back('\\');
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    escaped.push_back(c);
  }
  const std::string label = "model_name=\"" + escaped + "\"";
  const std::string l = "{" + label + "}";
  std::ostringstream os;
  os << std::setprecision(15);  // counters of bytes and tokens stay exact
  metric(os, "pagedattn_num_requests_running", "gauge", "Sequences running.", l, m.num_running);
  metric(os, "pagedattn_num_requests_waiting", "gauge", "Sequences waiting (new or preempted).", l,
         m.num_waiting);
  metric(os, "pagedattn_num_requests_active", "gauge", "Requests in the engine.", l,
         m.num_requests);
  metric(os, "pagedattn_kv_pages_total", "gauge", "KV cache pages.", l, m.pages_total);
  metric(os, "pagedattn_kv_pages_used", "gauge", "Pages referenced by a sequence.", l,
         m.pages_used);
  metric(os, "pagedattn_kv_pages_free", "gauge", "Pages in the free list.", l, m.pages_free);
  metric(os, "pagedattn_kv_pages_cached", "gauge", "Unreferenced pages kept for prefix reuse.", l,
         m.pages_cached);
  metric(os, "pagedattn_kv_cache_capacity_tokens", "gauge", "Tokens the KV cache holds.", l,
         double(m.kv_capacity_tokens));
  metric(os, "pagedattn_kv_cache_usage_perc", "gauge", "Fraction of pages in use.", l,
         m.pages_total ? double(m.pages_used) / m.pages_total : 0.0);
  metric(os, "pagedattn_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.", l, double(m.prefix_queried_tokens));
  metric(os, "pagedattn_prefix_cache_hits_total", "counter",
         "Prompt tokens reused from the prefix cache.", l, double(m.prefix_hit_tokens));
  metric(os, "pagedattn_prefix_cache_hit_rate", "gauge", "Prefix cache hits / queries.", l,
         m.prefix_hit_rate());
  metric(os, "pagedattn_num_preemptions_total", "counter", "Sequences preempted for lack of pages.",
         l, double(m.preemptions));
  metric(os, "pagedattn_num_preemptions_by_kind_total", "counter",
         "Preemptions by kind (recompute: pages freed, computed again at re-admission; swap: "
         "pages copied to host memory and back).",
         "{" + label + ",kind=\"recompute\"}", double(m.preemptions_recompute));
  os << "pagedattn_num_preemptions_by_kind_total{" << label << ",kind=\"swap\"} "
     << m.preemptions_swap << "\n";
  metric(os, "pagedattn_swapped_tokens_total", "counter",
         "Computed tokens that swap kept through a preemption (not recomputed).", l,
         double(m.swapped_tokens));
  metric(os, "pagedattn_swap_bytes_total", "counter", "Bytes of KV pages copied by swap.",
         "{" + label + ",direction=\"out\"}", double(m.swap_out_bytes));
  os << "pagedattn_swap_bytes_total{" << label << ",direction=\"in\"} " << m.swap_in_bytes
     << "\n";
  metric(os, "pagedattn_swap_seconds_total", "counter", "Seconds spent copying swapped pages.", l,
         m.swap_seconds);
  metric(os, "pagedattn_swap_pin_seconds_total", "counter",
         "Of the swap seconds, those spent pinning host memory (the swap space's first use).", l,
         m.swap_pin_seconds);
  metric(os, "pagedattn_num_requests_swapped", "gauge",
         "Waiting sequences whose KV pages are in host memory.", l, double(m.num_swapped));
  metric(os, "pagedattn_swap_space_usage_perc", "gauge", "Fraction of the swap space in use.", l,
         m.swap_space_bytes ? double(m.swap_used_bytes) / double(m.swap_space_bytes) : 0.0);
  metric(os, "pagedattn_recomputed_tokens_total", "counter",
         "Tokens computed again after a preemption.", l, double(m.recomputed_tokens));
  metric(os, "pagedattn_admission_stalls_total", "counter",
         "Steps in which the oldest waiting request waited for KV pages.", l,
         double(m.admission_stalls));
  metric(os, "pagedattn_prompt_tokens_total", "counter", "Prompt tokens received.", l,
         double(m.prompt_tokens));
  metric(os, "pagedattn_generation_tokens_total", "counter", "Tokens generated.", l,
         double(m.generation_tokens));
  metric(os, "pagedattn_request_success_total", "counter", "Requests finished.", l,
         double(m.requests_finished));
  metric(os, "pagedattn_request_cancelled_total", "counter", "Requests cancelled.", l,
         double(m.requests_cancelled));
  metric(os, "pagedattn_engine_steps_total", "counter", "Engine steps.", l, double(m.steps));
  metric(os, "pagedattn_generation_tokens_per_second", "gauge",
         "Generation throughput over the last seconds.", l, m.generation_tokens_per_s);
  histogram(os, "pagedattn_time_to_first_token_seconds", "Arrival to first token.", label,
            m.ttft_s);
  histogram(os, "pagedattn_inter_token_latency_seconds", "Time between tokens of a sequence.",
            label, m.itl_s);
  return os.str();
}

}  // namespace pagedattn
