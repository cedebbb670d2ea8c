// The tensor-parallel group's control link: TCP between rank 0 and each other rank. It carries the
// start-up (each rank's number, the NCCL id, the model) and then one frame per step (the batch);
// the tensors themselves go through NCCL. Each side watches the other for a hang-up, so a rank
// that dies ends the group instead of leaving the others blocked in a collective.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pagedattn::tp {

enum class FrameType : uint32_t { hello = 1, init = 2, step = 3, shutdown = 4, error = 5 };

struct Frame {
  FrameType type = FrameType::error;
  std::vector<uint8_t> body;
};

// Little-endian-as-the-host packing of the frames' bodies (both ends run this code).
class Writer {
 public:
  void i32(int32_t v) { raw(&v, sizeof(v)); }
  void u64(uint64_t v) { raw(&v, sizeof(v)); }
  void f64(double v) { raw(&v, sizeof(v)); }
  void str(const std::string& s);
  void i32s(const std::vector<int32_t>& v);
  void raw(const void* p, size_t n);
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

// Throws Error ("tensor parallel: malformed frame") when the body is shorter than what is read.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  int32_t i32();
  uint64_t u64();
  double f64();
  std::string str();
  std::vector<int32_t> i32s();
  void raw(void* p, size_t n);
  bool done() const { return at_ == b_.size(); }

 private:
  const std::vector<uint8_t>& b_;
  size_t at_ = 0;
};

// "host:port" -> (host, port). Error naming the text when malformed.
std::pair<std::string, int> parse_addr(const std::string& addr);

// Called once, from the watcher thread, with why the link failed.
using FailureFn = std::function<void(const std::string&)>;

// Rank 0's side: one connection per other rank.
class LeaderLink {
 public:
  // Listens on addr ("host:port"; port 0 picks a free one, see port()).
  explicit LeaderLink(const std::string& addr);
  ~LeaderLink();
  int port() const { return port_; }
  // Accepts world - 1 ranks (each says its rank in a hello frame; duplicates and ranks outside
  // 1..world-1 are refused). Error after timeout_s, naming the ranks still missing.
  void accept_ranks(int32_t world, double timeout_s);
  // The same frame to every rank. Error when a rank's connection is gone.
  void send_all(FrameType type, const std::vector<uint8_t>& body);
  // Starts watching every rank's connection: a hang-up (or an error frame) calls on_failure once
  // with the rank and its message. Stopped by close().
  void watch(FailureFn on_failure);
  // Sends shutdown to every rank still connected and closes the connections.
  void close();

 private:
  int listen_fd_ = -1, port_ = 0;
  std::vector<int> fds_;  // [world], fds_[0] unused
  std::mutex send_mu_;
  std::thread watcher_;
  std::atomic<bool> stop_{false};
};

// A worker's side.
class WorkerLink {
 public:
  // Connects to rank 0 at addr (retrying until timeout_s: rank 0 may not be listening yet) and
  // says its rank.
  WorkerLink(const std::string& addr, int32_t rank, double timeout_s);
  ~WorkerLink();
  // The next frame; Error when rank 0 closed the link or it broke.
  Frame recv();
  void send(FrameType type, const std::vector<uint8_t>& body);
  // Watches for rank 0 hanging up while this rank is busy (in a collective): calls on_failure
  // once. Frames still arrive through recv().
  void watch(FailureFn on_failure);
  void close();

 private:
  int fd_ = -1;
  std::thread watcher_;
  std::atomic<bool> stop_{false};
};

}  // namespace pagedattn::tp
