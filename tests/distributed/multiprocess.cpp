#include "multiprocess.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include <minigrad/core/error.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>

namespace mg::test {

namespace {

using Clock = std::chrono::steady_clock;

void write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    MG_CHECK(n > 0, "multiprocess: write to the parent failed: {}", std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void send_frame(int fd, const std::string& name, const std::string& value) {
  const uint32_t lengths[2] = {static_cast<uint32_t>(name.size()),
                               static_cast<uint32_t>(value.size())};
  write_all(fd, lengths, sizeof(lengths));
  write_all(fd, name.data(), name.size());
  write_all(fd, value.data(), value.size());
}

// Frames out of the bytes a rank sent.
std::vector<std::pair<std::string, std::string>> parse_frames(const std::string& bytes) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t pos = 0;
  while (pos + 8 <= bytes.size()) {
    uint32_t lengths[2];
    std::memcpy(lengths, bytes.data() + pos, sizeof(lengths));
    pos += 8;
    if (pos + lengths[0] + lengths[1] > bytes.size()) break;  // cut off by a kill
    std::string name = bytes.substr(pos, lengths[0]);
    pos += lengths[0];
    std::string value = bytes.substr(pos, lengths[1]);
    pos += lengths[1];
    out.emplace_back(std::move(name), std::move(value));
  }
  return out;
}

// Reads exactly 4 bytes (the store's port) from `fd`, waiting at most 60 s.
int read_port(int fd) {
  pollfd p{fd, POLLIN, 0};
  MG_CHECK(::poll(&p, 1, 60000) == 1, "multiprocess: rank 0 never published the store port");
  int32_t port = 0;
  MG_CHECK(::read(fd, &port, sizeof(port)) == sizeof(port),
           "multiprocess: short read of the store port");
  return port;
}

[[noreturn]] void run_child(int rank, int world_size, const std::function<void(RankContext&)>& body,
                            int result_fd, int port_read_fd, int port_write_fd, int release_fd) {
  RankContext ctx;
  ctx.rank = rank;
  ctx.world_size = world_size;
  ctx.result_fd = result_fd;
  int code = 0;
  try {
    parallel::TCPStoreOptions options;
    options.rank = rank;
    options.timeout = std::chrono::seconds(60);
    if (rank == 0) {
      options.is_server = true;
      ctx.store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, options);
      const int32_t port = ctx.store->port();
      for (int r = 1; r < world_size; ++r) write_all(port_write_fd, &port, sizeof(port));
    } else {
      ctx.store = std::make_shared<parallel::TCPStore>("127.0.0.1", read_port(port_read_fd), options);
    }
    body(ctx);
  } catch (const std::exception& e) {
    ctx.report("__error__", std::string(e.what()));
    code = 1;
  } catch (...) {
    ctx.report("__error__", std::string("a non-std exception (a Catch2 assertion inside a rank?)"));
    code = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  if (rank == 0) {
    // Keep serving the store until the parent has seen every other rank exit.
    char byte;
    while (::read(release_fd, &byte, 1) != 0 && errno == EINTR) {
    }
  }
  // No static destructors, no Catch2 summary from the child: just leave.
  _exit(code);
}

}  // namespace

std::shared_ptr<parallel::ProcessGroup> RankContext::gloo(std::chrono::milliseconds timeout) const {
#ifdef MINIGRAD_WITH_GLOO
  parallel::ProcessGroupOptions options;
  options.timeout = timeout;
  return std::make_shared<parallel::ProcessGroupGloo>(store, rank, world_size, options);
#else
  // The Gloo tests are compiled out then (a GPU machine without libgloo-dev); this keeps
  // the helper building for the NCCL ones.
  (void)timeout;
  MG_FAIL("RankContext::gloo: minigrad was built without Gloo");
#endif
}

void RankContext::start_together() const {
  store->set(fmt::format("multiprocess/started/{}", rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(fmt::format("multiprocess/started/{}", r));
  store->wait(keys, std::chrono::seconds(60));
}

void RankContext::report(const std::string& name, const std::vector<float>& values) {
  send_frame(result_fd, name,
             std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
}

void RankContext::report(const std::string& name, const Tensor& tensor) {
  report(name, tensor.contiguous().to_vector<float>());
}

void RankContext::report(const std::string& name, const std::string& text) {
  send_frame(result_fd, name, text);
}

std::vector<float> RankResult::floats(const std::string& name) const {
  for (const auto& [n, v] : reports) {
    if (n != name) continue;
    std::vector<float> out(v.size() / sizeof(float));
    std::memcpy(out.data(), v.data(), out.size() * sizeof(float));
    return out;
  }
  MG_FAIL("rank {} reported no '{}' (error: {})", rank, name, error);
}

std::string RankResult::text(const std::string& name) const {
  for (const auto& [n, v] : reports)
    if (n == name) return v;
  MG_FAIL("rank {} reported no '{}' (error: {})", rank, name, error);
}

std::vector<RankResult> run_ranks(int world_size, const std::function<void(RankContext&)>& body,
                                  std::chrono::seconds hang_guard) {
  std::fflush(stdout);
  std::fflush(stderr);
  int port_pipe[2], release_pipe[2];
  MG_CHECK(::pipe(port_pipe) == 0 && ::pipe(release_pipe) == 0, "multiprocess: pipe failed");
  std::vector<int> result_read(static_cast<size_t>(world_size), -1);
  std::vector<int> result_write(static_cast<size_t>(world_size), -1);
  for (int r = 0; r < world_size; ++r) {
    int p[2];
    MG_CHECK(::pipe(p) == 0, "multiprocess: pipe failed");
    result_read[static_cast<size_t>(r)] = p[0];
    result_write[static_cast<size_t>(r)] = p[1];
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < world_size; ++r) {
    const pid_t pid = ::fork();
    MG_CHECK(pid >= 0, "multiprocess: fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      // Only our own result pipe stays open, so the parent sees EOF when we are gone.
      for (int k = 0; k < world_size; ++k) {
        ::close(result_read[static_cast<size_t>(k)]);
        if (k != r) ::close(result_write[static_cast<size_t>(k)]);
      }
      ::close(release_pipe[1]);
      run_child(r, world_size, body, result_write[static_cast<size_t>(r)], port_pipe[0],
                port_pipe[1], release_pipe[0]);
    }
    pids.push_back(pid);
  }
  for (int fd : result_write) ::close(fd);
  ::close(port_pipe[0]);
  ::close(port_pipe[1]);
  ::close(release_pipe[0]);

  std::vector<RankResult> results(static_cast<size_t>(world_size));
  std::vector<std::string> bytes(static_cast<size_t>(world_size));
  std::vector<bool> open(static_cast<size_t>(world_size), true);
  std::vector<bool> exited(static_cast<size_t>(world_size), false);
  bool released = false;
  bool hung = false;
  const auto deadline = Clock::now() + hang_guard;
  for (;;) {
    // Reap whoever exited.
    for (int r = 0; r < world_size; ++r) {
      if (exited[static_cast<size_t>(r)]) continue;
      int status = 0;
      if (::waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) == pids[static_cast<size_t>(r)]) {
        exited[static_cast<size_t>(r)] = true;
        RankResult& res = results[static_cast<size_t>(r)];
        res.rank = r;
        if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) res.signal = WTERMSIG(status);
      }
    }
    bool others_gone = true;
    for (int r = 1; r < world_size; ++r) others_gone = others_gone && exited[static_cast<size_t>(r)];
    if (others_gone && !released) {
      ::close(release_pipe[1]);  // rank 0 may stop serving the store now
      released = true;
    }
    bool all_done = true;
    for (int r = 0; r < world_size; ++r)
      all_done = all_done && exited[static_cast<size_t>(r)] && !open[static_cast<size_t>(r)];
    if (all_done) break;
    if (Clock::now() > deadline) {
      hung = true;
      for (int r = 0; r < world_size; ++r)
        if (!exited[static_cast<size_t>(r)]) ::kill(pids[static_cast<size_t>(r)], SIGKILL);
    }
    // Drain the result pipes (a full pipe would block a rank).
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    for (int r = 0; r < world_size; ++r) {
      if (!open[static_cast<size_t>(r)]) continue;
      fds.push_back({result_read[static_cast<size_t>(r)], POLLIN, 0});
      ranks.push_back(r);
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    ::poll(fds.data(), fds.size(), 20);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char chunk[65536];
      const ssize_t n = ::read(fds[i].fd, chunk, sizeof(chunk));
      const size_t r = static_cast<size_t>(ranks[i]);
      if (n > 0) {
        bytes[r].append(chunk, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        open[r] = false;
        ::close(fds[i].fd);
      }
    }
  }
  if (!released) ::close(release_pipe[1]);
  for (int r = 0; r < world_size; ++r) {
    RankResult& res = results[static_cast<size_t>(r)];
    res.rank = r;
    for (auto& [name, value] : parse_frames(bytes[static_cast<size_t>(r)])) {
      if (name == "__error__") {
        res.error = value;
      } else {
        res.reports.emplace_back(name, value);
      }
    }
    if (hung && res.error.empty() && res.signal == SIGKILL)
      res.error = fmt::format("hung: killed after the {} s guard", hang_guard.count());
  }
  return results;
}

std::string describe(const std::vector<RankResult>& results) {
  std::string out;
  for (const RankResult& r : results) {
    out += fmt::format("rank {}: exit {}, signal {}{}{}\n", r.rank, r.exit_code, r.signal,
                       r.error.empty() ? "" : ", error: ", r.error);
  }
  return out;
}

}  // namespace mg::test
