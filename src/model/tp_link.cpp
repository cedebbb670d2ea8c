// TCP for the tensor-parallel control link (tp_link.h).
#include "tp_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "pagedattn/error.h"

namespace pagedattn::tp {

namespace {

constexpr const char* kOp = "tensor parallel";
constexpr uint64_t kMaxFrame = uint64_t(1) << 30;

using Clock = std::chrono::steady_clock;

void write_all(int fd, const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    PA_CHECK(w > 0, kOp, ": the link to a rank broke (", std::strerror(errno), ")");
    c += w;
    n -= size_t(w);
  }
}

// False at a clean end of stream before the first byte.
bool read_all(int fd, void* p, size_t n) {
  auto* c = static_cast<uint8_t*>(p);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, c + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && got == 0) return false;
    PA_CHECK(r > 0, kOp, ": the link broke in the middle of a frame");
    got += size_t(r);
  }
  return true;
}

void send_frame(int fd, FrameType type, const std::vector<uint8_t>& body) {
  uint8_t head[12];
  const uint32_t t = uint32_t(type);
  const uint64_t n = body.size();
  std::memcpy(head, &t, 4);
  std::memcpy(head + 4, &n, 8);
  write_all(fd, head, sizeof(head));
  if (!body.empty()) write_all(fd, body.data(), body.size());
}

bool recv_frame(int fd, Frame& f) {
  uint8_t head[12];
  if (!read_all(fd, head, sizeof(head))) return false;
  uint32_t t = 0;
  uint64_t n = 0;
  std::memcpy(&t, head, 4);
  std::memcpy(&n, head + 4, 8);
  PA_CHECK(t >= 1 && t <= 5 && n <= kMaxFrame, kOp, ": malformed frame (type ", t, ", ", n,
           " bytes)");
  f.type = FrameType(t);
  f.body.resize(size_t(n));
  if (n > 0) PA_CHECK(read_all(fd, f.body.data(), size_t(n)), kOp, ": the link closed mid-frame");
  return true;
}

void no_delay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

sockaddr_in resolve(const std::string& addr) {
  const auto [host, port] = parse_addr(addr);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  PA_CHECK(rc == 0 && res, kOp, ": cannot resolve host '", host, "' of --init-addr ", addr, " (",
           gai_strerror(rc), ")");
  sockaddr_in sa = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  sa.sin_port = htons(uint16_t(port));
  return sa;
}

// Waits for a hang-up on any of fds (without reading: POLLRDHUP); returns its index or -1 when
// stop is set.
int wait_hangup(const std::vector<int>& fds, const std::atomic<bool>& stop) {
  std::vector<pollfd> p;
  for (int fd : fds) p.push_back(pollfd{fd, POLLRDHUP, 0});
  while (!stop.load()) {
    const int rc = ::poll(p.data(), p.size(), 100);
    if (rc <= 0) continue;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return int(i);
    }
  }
  return -1;
}

// An error frame's message if the peer left one before hanging up.
std::string last_words(int fd) {
  Frame f;
  try {
    while (recv_frame(fd, f)) {
      if (f.type == FrameType::error) return std::string(f.body.begin(), f.body.end());
    }
  } catch (const Error&) {
  }
  return "";
}

}  // namespace

void Writer::raw(const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  buf_.insert(buf_.end(), c, c + n);
}
void Writer::str(const std::string& s) {
  u64(s.size());
  raw(s.data(), s.size());
}
void Writer::i32s(const std::vector<int32_t>& v) {
  u64(v.size());
  raw(v.data(), v.size() * sizeof(int32_t));
}

void Reader::raw(void* p, size_t n) {
  PA_CHECK(n <= b_.size() - at_, kOp, ": malformed frame (", b_.size(), " bytes, reading ", n,
           " at ", at_, ")");
  std::memcpy(p, b_.data() + at_, n);
  at_ += n;
}
int32_t Reader::i32() {
  int32_t v;
  raw(&v, sizeof(v));
  return v;
}
uint64_t Reader::u64() {
  uint64_t v;
  raw(&v, sizeof(v));
  return v;
}
double Reader::f64() {
  double v;
  raw(&v, sizeof(v));
  return v;
}
std::string Reader::str() {
  const uint64_t n = u64();
  PA_CHECK(n <= b_.size() - at_, kOp, ": malformed frame (a string of ", n, " bytes)");
  std::string s(n, '\0');
  raw(s.data(), n);
  return s;
}
std::vector<int32_t> Reader::i32s() {
  const uint64_t n = u64();
  PA_CHECK(n <= (b_.size() - at_) / sizeof(int32_t), kOp, ": malformed frame (", n, " ints)");
  std::vector<int32_t> v(n);
  raw(v.data(), n * sizeof(int32_t));
  return v;
}

std::pair<std::string, int> parse_addr(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  PA_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < addr.size(), kOp,
           ": --init-addr '", addr, "' is not host:port");
  const std::string port_text = addr.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  PA_CHECK(end == port_text.c_str() + port_text.size() && port >= 0 && port <= 65535, kOp,
           ": --init-addr '", addr, "' has no port number in 0..65535");
  return {addr.substr(0, colon), int(port)};
}

LeaderLink::LeaderLink(const std::string& addr) {
  sockaddr_in sa = resolve(addr);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PA_CHECK(listen_fd_ >= 0, kOp, ": socket: ", std::strerror(errno));
  int one = 1;
  (void)setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listen_fd_);
    listen_fd_ = -1;
    fail(kOp, ": cannot listen on ", addr, ": ", why);
  }
  socklen_t len = sizeof(sa);
  (void)getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
}

LeaderLink::~LeaderLink() {
  try {
    close();
  } catch (...) {
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void LeaderLink::accept_ranks(int32_t world, double timeout_s) {
  fds_.assign(size_t(world), -1);
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (int32_t joined = 1; joined < world;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      std::string missing;
      for (int32_t r = 1; r < world; ++r)
        if (fds_[size_t(r)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail(kOp, ": ranks ", missing, " did not join within ", timeout_s, " s");
    }
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, int(std::min<int64_t>(left.count(), 1000))) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    no_delay(fd);
    Frame f;
    int32_t rank = -1;
    try {
      if (recv_frame(fd, f) && f.type == FrameType::hello) rank = Reader(f.body).i32();
    } catch (const Error&) {
    }
    if (rank < 1 || rank >= world || fds_[size_t(rank)] >= 0) {
      const std::string why = "rank " + std::to_string(rank) + " is not expected in a world of " +
                              std::to_string(world) + " (or joined twice)";
      try {
        send_frame(fd, FrameType::error, std::vector<uint8_t>(why.begin(), why.end()));
      } catch (const Error&) {
      }
      ::close(fd);
      continue;
    }
    fds_[size_t(rank)] = fd;
    ++joined;
  }
}

void LeaderLink::send_all(FrameType type, const std::vector<uint8_t>& body) {
  std::lock_guard<std::mutex> lock(send_mu_);
  for (size_t r = 1; r < fds_.size(); ++r) {
    PA_CHECK(fds_[r] >= 0, kOp, ": rank ", r, " is not connected");
    send_frame(fds_[r], type, body);
  }
}

void LeaderLink::watch(FailureFn on_failure) {
  std::vector<int> fds(fds_.begin() + 1, fds_.end());
  watcher_ = std::thread([this, fds, on_failure] {
    const int i = wait_hangup(fds, stop_);
    if (i < 0) return;
    const std::string words = last_words(fds[size_t(i)]);
    on_failure("rank " + std::to_string(i + 1) +
               (words.empty() ? " exited or lost its connection" : " failed: " + words));
  });
}

void LeaderLink::close() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
  std::lock_guard<std::mutex> lock(send_mu_);
  for (size_t r = 1; r < fds_.size(); ++r) {
    if (fds_[r] < 0) continue;
    try {
      send_frame(fds_[r], FrameType::shutdown, {});
    } catch (const Error&) {
    }
    ::shutdown(fds_[r], SHUT_RDWR);
    ::close(fds_[r]);
    fds_[r] = -1;
  }
}

WorkerLink::WorkerLink(const std::string& addr, int32_t rank, double timeout_s) {
  const sockaddr_in sa = resolve(addr);
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  std::string why;
  while (true) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    PA_CHECK(fd_ >= 0, kOp, ": socket: ", std::strerror(errno));
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0) break;
    why = std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    PA_CHECK(Clock::now() < deadline, kOp, ": rank ", rank, " could not reach rank 0 at ", addr,
             " within ", timeout_s, " s (", why, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  no_delay(fd_);
  Writer w;
  w.i32(rank);
  send_frame(fd_, FrameType::hello, w.take());
}

WorkerLink::~WorkerLink() { close(); }

namespace {

// Peeks without blocking, for up to `seconds`, until fd has a byte (or an end or an error, which
// the read then reports): a worker's next step frame comes a fraction of a millisecond after its
// last step ends, and waking from a blocking read would add tens of microseconds to every step
// (every rank's first all-reduce waits for the last rank to start). The worker already spends its
// steps polling its stream; after `seconds` without a frame (an idle server) the read blocks.
void spin_until_readable(int fd, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  char c = 0;
  while (std::chrono::steady_clock::now() < until) {
    const ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
  }
}

}  // namespace

Frame WorkerLink::recv() {
  Frame f;
  if (fd_ >= 0) spin_until_readable(fd_, 0.05);
  PA_CHECK(fd_ >= 0 && recv_frame(fd_, f), kOp, ": rank 0 closed the link");
  if (f.type == FrameType::error)
    fail(kOp, ": rank 0 refused this rank: ", std::string(f.body.begin(), f.body.end()));
  return f;
}

void WorkerLink::send(FrameType type, const std::vector<uint8_t>& body) {
  PA_CHECK(fd_ >= 0, kOp, ": the link to rank 0 is closed");
  send_frame(fd_, type, body);
}

void WorkerLink::watch(FailureFn on_failure) {
  const int fd = fd_;
  watcher_ = std::thread([this, fd, on_failure] {
    if (wait_hangup({fd}, stop_) >= 0) on_failure("rank 0 closed the link");
  });
}

void WorkerLink::close() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

}  // namespace pagedattn::tp
