// Packing of the tensor-parallel group's init and step frames (tp_step.h).
#include "tp_step.h"

#include <cmath>

#include "pagedattn/error.h"

namespace pagedattn::tp {

std::vector<uint8_t> encode_init(const InitMessage& m) {
  Writer w;
  w.str(m.model);
  w.i32(m.world);
  w.str(std::string(m.nccl_id.begin(), m.nccl_id.end()));
  return w.take();
}

InitMessage decode_init(const std::vector<uint8_t>& body) {
  Reader r(body);
  InitMessage m;
  m.model = r.str();
  m.world = r.i32();
  const std::string id = r.str();
  m.nccl_id.assign(id.begin(), id.end());
  PA_CHECK(r.done() && m.nccl_id.size() == 128 && m.world >= 1,
           "tensor parallel: malformed init frame");
  return m;
}

std::vector<uint8_t> encode_step(const StepMessage& m) {
  Writer w;
  for (int32_t v : {m.num_layers, m.head_dim, m.page_size, m.num_pages, int32_t(m.dtype),
                    int32_t(m.cuda_graphs), int32_t(m.greedy), int32_t(m.open), m.time_tokens,
                    m.time_rows, m.time_reps})
    w.i32(v);
  std::vector<int32_t> copies;
  for (const PageCopy& c : m.copies) copies.insert(copies.end(), {c.dst, c.src, c.filled});
  w.i32s(copies);
  const ForwardBatch& b = m.batch;
  w.u64(b.seqs.size());
  w.raw(b.seqs.data(), b.seqs.size() * sizeof(SeqId));
  for (const std::vector<int32_t>* v :
       {&b.q_indptr, &b.tokens, &b.positions, &b.slots, &b.logit_rows, &b.kv_len, &b.block_table})
    w.i32s(*v);
  w.i32(b.max_pages);
  w.i32s(m.calibrate);
  w.raw(&m.kv_headroom, sizeof(float));
  return w.take();
}

StepMessage decode_step(const std::vector<uint8_t>& body) {
  Reader r(body);
  StepMessage m;
  m.num_layers = r.i32();
  m.head_dim = r.i32();
  m.page_size = r.i32();
  m.num_pages = r.i32();
  const int32_t dtype = r.i32();
  PA_CHECK(dtype >= 0 && dtype <= int32_t(DType::fp8_e4m3), "tensor parallel: malformed step frame");
  m.dtype = DType(dtype);
  m.cuda_graphs = r.i32() != 0;
  m.greedy = r.i32() != 0;
  m.open = r.i32() != 0;
  m.time_tokens = r.i32();
  m.time_rows = r.i32();
  m.time_reps = r.i32();
  const std::vector<int32_t> copies = r.i32s();
  PA_CHECK(copies.size() % 3 == 0, "tensor parallel: malformed step frame");
  for (size_t i = 0; i < copies.size(); i += 3)
    m.copies.push_back(PageCopy{copies[i], copies[i + 1], copies[i + 2]});
  ForwardBatch& b = m.batch;
  const uint64_t n = r.u64();
  PA_CHECK(n <= body.size() / sizeof(SeqId), "tensor parallel: malformed step frame");
  b.seqs.resize(n);
  r.raw(b.seqs.data(), n * sizeof(SeqId));
  for (std::vector<int32_t>* v :
       {&b.q_indptr, &b.tokens, &b.positions, &b.slots, &b.logit_rows, &b.kv_len, &b.block_table})
    *v = r.i32s();
  b.max_pages = r.i32();
  m.calibrate = r.i32s();
  r.raw(&m.kv_headroom, sizeof(float));
  PA_CHECK(std::isfinite(m.kv_headroom) && m.kv_headroom >= 0.f,
           "tensor parallel: malformed step frame (KV headroom)");
  PA_CHECK(r.done(), "tensor parallel: malformed step frame (trailing bytes)");
  return m;
}

}  // namespace pagedattn::tp
