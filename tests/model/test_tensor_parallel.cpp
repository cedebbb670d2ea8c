// Tensor parallelism's host side: which slice each rank holds (and that the slices put back
// together are the whole model), the step frames, the control link and its failure detection,
// and the copy-on-write log a leader replays on the other ranks.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "model/tp_link.h"
#include "model/tp_step.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/synthetic_model.h"
#include "pagedattn/tensor_parallel.h"
#include "tiny_models.h"

namespace pagedattn {
namespace {

using testing::tiny_config;
using testing::TinySize;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorParallelSlices, Llama3_8bOverTwoAndSixteen) {
  const ModelConfig c = synthetic_model_config("synthetic:llama3-8b");
  const TpSlices a = tp_slices(c, TpShard{1, 2});
  EXPECT_EQ(a.q_heads, 16);
  EXPECT_EQ(a.q_head0, 16);
  EXPECT_EQ(a.kv_heads, 4);
  EXPECT_EQ(a.kv_head0, 4);
  EXPECT_EQ(a.inter, 7168);
  EXPECT_EQ(a.inter0, 7168);
  EXPECT_EQ(a.vocab_stride, 64128);
  EXPECT_EQ(a.vocab0, 64128);
  EXPECT_EQ(a.vocab, 64128);
  // 16 ranks, 8 KV heads: each KV head on two ranks, whose q heads (2 each) are in its group of 4.
  for (int32_t r = 0; r < 16; ++r) {
    const TpSlices s = tp_slices(c, TpShard{r, 16});
    EXPECT_EQ(s.kv_heads, 1);
    EXPECT_EQ(s.kv_head0, r / 2);
    EXPECT_EQ(s.q_head0 / (c.num_q_heads / c.num_kv_heads), s.kv_head0) << "rank " << r;
  }
}

TEST(TensorParallelSlices, RefusesShapesThatDoNotSplit) {
  const ModelConfig c = synthetic_model_config("synthetic:llama3-8b");
  EXPECT_NE(error_of([&] { tp_slices(c, TpShard{0, 3}); }).find("32 attention heads do not divide"),
            std::string::npos);
  ModelConfig odd = c;
  odd.num_q_heads = 48;
  odd.num_kv_heads = 12;
  EXPECT_NE(error_of([&] { tp_slices(odd, TpShard{0, 8}); }).find("12 KV heads do not divide"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tp_slices(c, TpShard{2, 2}); }).find("rank 2 is not in a world of 2"),
            std::string::npos);
}

// Every rank's slice of every tensor written back at its block: each element of the whole is
// covered, and where blocks overlap (replicated norms, replicated KV heads) the copies agree.
void expect_slices_rebuild_the_model(const ModelConfig& config, int32_t world) {
  const ModelFile file = make_synthetic_model_file(config, 3);
  ModelConfig c = file.config;
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_q_heads;
  for (const auto& [name, whole] : file.tensors) {
    const int64_t n = whole.numel();
    std::vector<float> rebuilt(size_t(n), 0.f);
    std::vector<int> covered(size_t(n), 0);
    for (int32_t r = 0; r < world; ++r) {
      const TpShard shard{r, world};
      const Tensor part = tp_weight_slice(whole, name, c, shard);
      const TpBlock b = tp_block(name, whole.shape(), c, shard);
      ASSERT_EQ(part.numel(), b.rows * b.cols) << name;
      for (int64_t i = 0; i < b.rows; ++i) {
        for (int64_t j = 0; j < b.cols; ++j) {
          const size_t at = size_t((b.row0 + i) * b.whole_cols + b.col0 + j);
          const float v = part.data_as<float>()[i * b.cols + j];
          if (covered[at]) ASSERT_EQ(rebuilt[at], v) << name << " rank " << r;
          rebuilt[at] = v;
          ++covered[at];
        }
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_GT(covered[size_t(i)], 0) << name << " element " << i << " held by no rank";
      ASSERT_EQ(rebuilt[size_t(i)], whole.data_as<float>()[i]) << name << " element " << i;
    }
  }
}

TEST(TensorParallelSlices, RanksSlicesPutBackTogetherAreTheWholeModel) {
  for (const char* variant : {"llama", "qwen2", "qwen3", "mistral"}) {
    for (int32_t world : {1, 2, 4}) {
      SCOPED_TRACE(std::string(variant) + " over " + std::to_string(world));
      expect_slices_rebuild_the_model(tiny_config(variant, TinySize::gpu), world);
    }
  }
}

TEST(TensorParallelSlices, SplitsWhatItShould) {
  const ModelConfig c = tiny_config("llama", TinySize::gpu);  // 4/2 heads of 64, vocab 300
  const std::string p = "model.layers.0.";
  const TpShard r1{1, 2};
  const TpBlock q = tp_block(p + "self_attn.q_proj.weight", {256, 256}, c, r1);
  EXPECT_EQ(q.row0, 128);
  EXPECT_EQ(q.rows, 128);
  EXPECT_EQ(q.cols, 256);
  const TpBlock o = tp_block(p + "self_attn.o_proj.weight", {256, 256}, c, r1);
  EXPECT_EQ(o.col0, 128);
  EXPECT_EQ(o.cols, 128);
  EXPECT_EQ(o.rows, 256);
  const TpBlock down = tp_block(p + "mlp.down_proj.weight", {256, 512}, c, r1);
  EXPECT_EQ(down.col0, 256);
  EXPECT_EQ(down.cols, 256);
  const TpBlock emb = tp_block("model.embed_tokens.weight", {300, 256}, c, r1);
  EXPECT_EQ(emb.row0, 150);
  EXPECT_EQ(emb.rows, 150);
  const TpBlock norm = tp_block(p + "input_layernorm.weight", {256}, c, r1);
  EXPECT_EQ(norm.cols, 256);
  const TpBlock bias = tp_block(p + "self_attn.k_proj.bias", {128}, c, r1);
  EXPECT_EQ(bias.col0, 64);
  EXPECT_EQ(bias.cols, 64);
}

TEST(TensorParallelFrames, StepRoundTrips) {
  tp::StepMessage m;
  m.num_layers = 3;
  m.head_dim = 64;
  m.page_size = 16;
  m.num_pages = 99;
  m.dtype = DType::bf16;
  m.cuda_graphs = false;
  m.greedy = true;
  m.open = true;
  m.copies = {PageCopy{5, 2, 7}, PageCopy{9, 1, 15}};
  ForwardBatch& b = m.batch;
  b.seqs = {4, 1ll << 40};
  b.q_indptr = {0, 2, 3};
  b.tokens = {10, 11, 12};
  b.positions = {0, 1, 6};
  b.slots = {32, 33, 70};
  b.logit_rows = {1, 2};
  b.kv_len = {2, 7};
  b.block_table = {2, 0, 3, 4};
  b.max_pages = 2;
  const tp::StepMessage d = tp::decode_step(tp::encode_step(m));
  EXPECT_EQ(d.num_layers, 3);
  EXPECT_EQ(d.num_pages, 99);
  EXPECT_EQ(d.dtype, DType::bf16);
  EXPECT_FALSE(d.cuda_graphs);
  EXPECT_TRUE(d.greedy);
  EXPECT_TRUE(d.open);
  ASSERT_EQ(d.copies.size(), 2u);
  EXPECT_EQ(d.copies[1].dst, 9);
  EXPECT_EQ(d.copies[1].filled, 15);
  EXPECT_EQ(d.batch.seqs, b.seqs);
  EXPECT_EQ(d.batch.q_indptr, b.q_indptr);
  EXPECT_EQ(d.batch.tokens, b.tokens);
  EXPECT_EQ(d.batch.positions, b.positions);
  EXPECT_EQ(d.batch.slots, b.slots);
  EXPECT_EQ(d.batch.logit_rows, b.logit_rows);
  EXPECT_EQ(d.batch.kv_len, b.kv_len);
  EXPECT_EQ(d.batch.block_table, b.block_table);
  EXPECT_EQ(d.batch.max_pages, 2);
  EXPECT_TRUE(d.calibrate.empty());
  EXPECT_EQ(d.kv_headroom, 0.f);

  // The fp8 calibration's frames: its tokens, then the headroom; a headroom that is not a finite
  // value >= 0 is refused by name.
  tp::StepMessage cal;
  cal.calibrate = {7, 0, 4095};
  const tp::StepMessage dc = tp::decode_step(tp::encode_step(cal));
  EXPECT_EQ(dc.calibrate, cal.calibrate);
  EXPECT_EQ(dc.kv_headroom, 0.f);
  tp::StepMessage room;
  room.kv_headroom = 1.25f;
  EXPECT_EQ(tp::decode_step(tp::encode_step(room)).kv_headroom, 1.25f);
  room.kv_headroom = -1.f;
  EXPECT_NE(error_of([&] { tp::decode_step(tp::encode_step(room)); }).find("KV headroom"),
            std::string::npos);
  room.kv_headroom = std::nanf("");
  EXPECT_NE(error_of([&] { tp::decode_step(tp::encode_step(room)); }).find("KV headroom"),
            std::string::npos);

  std::vector<uint8_t> cut = tp::encode_step(m);
  cut.resize(cut.size() - 5);
  EXPECT_NE(error_of([&] { tp::decode_step(cut); }).find("malformed"), std::string::npos);
  std::vector<uint8_t> longer = tp::encode_step(m);
  longer.push_back(0);
  EXPECT_NE(error_of([&] { tp::decode_step(longer); }).find("trailing"), std::string::npos);
}

TEST(TensorParallelFrames, InitRoundTrips) {
  tp::InitMessage m{"synthetic:llama3-8b", 4, std::vector<char>(128, 'x')};
  m.nccl_id[7] = '\0';
  const tp::InitMessage d = tp::decode_init(tp::encode_init(m));
  EXPECT_EQ(d.model, m.model);
  EXPECT_EQ(d.world, 4);
  EXPECT_EQ(d.nccl_id, m.nccl_id);
}

TEST(TensorParallelLink, LeaderReachesEveryRankAndSeesOneDie) {
  tp::LeaderLink leader("127.0.0.1:0");
  const std::string addr = "127.0.0.1:" + std::to_string(leader.port());
  std::vector<std::unique_ptr<tp::WorkerLink>> workers(3);
  std::vector<std::thread> joiners;
  for (int32_t r = 1; r <= 3; ++r) {
    joiners.emplace_back([&, r] { workers[size_t(r - 1)] = std::make_unique<tp::WorkerLink>(addr, r, 10); });
  }
  leader.accept_ranks(4, 10);
  for (std::thread& t : joiners) t.join();
  std::atomic<int> failures{0};
  std::string why;
  std::mutex mu;
  leader.watch([&](const std::string& w) {
    std::lock_guard<std::mutex> lock(mu);
    why = w;
    ++failures;
  });
  leader.send_all(tp::FrameType::step, {1, 2, 3});
  for (auto& w : workers) {
    const tp::Frame f = w->recv();
    EXPECT_EQ(f.type, tp::FrameType::step);
    EXPECT_EQ(f.body, (std::vector<uint8_t>{1, 2, 3}));
  }
  // Rank 2 fails: it says why and hangs up.
  const std::string msg = "out of memory";
  workers[1]->send(tp::FrameType::error, std::vector<uint8_t>(msg.begin(), msg.end()));
  workers[1]->close();
  for (int i = 0; i < 100 && failures.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(failures.load(), 1);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(why, "rank 2 failed: out of memory");
  }
  leader.close();
  // The others learn the group is over.
  EXPECT_EQ(workers[0]->recv().type, tp::FrameType::shutdown);
  EXPECT_NE(error_of([&] { workers[2]->recv(); workers[2]->recv(); }).find("rank 0 closed"),
            std::string::npos);
}

TEST(TensorParallelLink, WorkerSeesTheLeaderGo) {
  auto leader = std::make_unique<tp::LeaderLink>("127.0.0.1:0");
  const std::string addr = "127.0.0.1:" + std::to_string(leader->port());
  std::unique_ptr<tp::WorkerLink> w;
  std::thread t([&] { w = std::make_unique<tp::WorkerLink>(addr, 1, 10); });
  leader->accept_ranks(2, 10);
  t.join();
  std::atomic<int> failures{0};
  w->watch([&](const std::string&) { ++failures; });
  leader.reset();  // rank 0 exits
  for (int i = 0; i < 100 && failures.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(failures.load(), 1);
}

TEST(TensorParallelLink, RefusesUnexpectedRanksAndTimesOut) {
  tp::LeaderLink leader("127.0.0.1:0");
  const std::string addr = "127.0.0.1:" + std::to_string(leader.port());
  std::thread t([&] {
    tp::WorkerLink bad(addr, 7, 10);  // not a rank of a world of 2
    EXPECT_NE(error_of([&] { bad.recv(); }).find("rank 7 is not expected"), std::string::npos);
  });
  EXPECT_NE(error_of([&] { leader.accept_ranks(2, 0.5); }).find("ranks 1 did not join"),
            std::string::npos);
  t.join();
  EXPECT_NE(error_of([] { tp::parse_addr("nohost"); }).find("is not host:port"), std::string::npos);
  EXPECT_NE(error_of([] { tp::parse_addr("h:99999"); }).find("no port number"), std::string::npos);
}

TEST(TensorParallelCache, CopyOnWriteCopiesAreLoggedAndReplay) {
  const ModelConfig c = tiny_config("llama");
  KvCacheConfig kc = testing::model_kv_config(c, 8, 4);
  kc.record_page_copies = true;
  KvCache leader(kc);
  kc.record_page_copies = false;
  KvCache follower(kc);
  // The same K/V bytes in both pools' page 0..1 (as if both ranks ran the same steps).
  const SeqId s = leader.create_sequence();
  leader.append_slots(s, std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  for (KvCache* cache : {&leader, &follower}) {
    for (int32_t l = 0; l < kc.num_layers; ++l) {
      const PagedKVView v = cache->layer_view(l);
      auto* k = static_cast<float*>(v.k_pages);
      for (int64_t i = 0; i < v.page_stride() * v.num_pages; ++i) k[i] = float(i % 1000) + l;
    }
  }
  leader.commit(s);
  const SeqId child = leader.fork(s);
  leader.append_slots(child, std::vector<int32_t>{7});  // the shared tail page is copied
  const std::vector<PageCopy> copies = leader.take_page_copies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].filled, 2);
  EXPECT_TRUE(leader.take_page_copies().empty());
  for (const PageCopy& pc : copies) follower.copy_page_prefix(pc);
  const PagedKVView a = leader.layer_view(1), b = follower.layer_view(1);
  const size_t bytes = size_t(a.page_stride() * a.num_pages) * sizeof(float);
  EXPECT_EQ(std::memcmp(a.k_pages, b.k_pages, bytes), 0);
  EXPECT_NE(error_of([&] { follower.copy_page_prefix(PageCopy{8, 0, 1}); }).find("not both in"),
            std::string::npos);
  EXPECT_NE(error_of([&] { follower.copy_page_prefix(PageCopy{1, 0, 5}); }).find("filled 5"),
            std::string::npos);
}

}  // namespace
}  // namespace pagedattn
