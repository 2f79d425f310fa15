// The TCPStore server against clients that misbehave: one that never reads its replies,
// hundreds that stay idle, announcements of gigabytes, a request of 65536 arguments,
// strangers and garbage, and the open-file limit. No client may stall another, hold
// unbounded memory, or make the server spin.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "catch_compat.h"
#include "multiprocess.h"
#include "store_test_util.h"

#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/store/tcp_store.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<TCPStore> make_server(TCPStoreOptions options = {}) {
  options.is_server = true;
  options.rank = 0;
  options.timeout = 10s;
  return std::make_unique<TCPStore>("127.0.0.1", 0, options);
}

std::unique_ptr<TCPStore> make_client(int port, int rank, std::chrono::milliseconds timeout = 10s,
                                      TCPStoreOptions options = {}) {
  options.rank = rank;
  options.timeout = timeout;
  return std::make_unique<TCPStore>("127.0.0.1", port, options);
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A set request's first bytes as they would be if its payload were `payload` bytes.
std::string set_header(uint32_t payload, uint32_t key_length) {
  std::string h(1, static_cast<char>(store::kSet));
  put_u32(h, 2);
  put_u32(h, payload);
  put_u32(h, key_length);
  return h;
}

constexpr std::size_t kMiB = std::size_t{1} << 20;

}  // namespace

TEST_CASE("TCPStore server: a client that never reads its replies is dropped, and the others are "
          "served meanwhile") {
  StderrCapture log;
  auto server = make_server();
  RawStoreClient slow(server->port());
  slow.hello();
  slow.send(store::kSet, {"default/big", std::string(kMiB, 'x')});
  // 100 gets of 1 MiB each, and not one reply read: 100 MiB for the server to hold.
  std::string gets;
  for (int i = 0; i < 100; ++i) store::append_message(gets, store::kGet, {"default/big"});
  slow.send_bytes(gets);

  // Served within its 5 s timeout, or this throws (a server blocked on `slow` never answers).
  auto client = make_client(server->port(), 1, 5s);
  for (int i = 0; i < 20; ++i) {
    client->set("k", std::to_string(i));
    REQUIRE(client->get("k") == std::to_string(i));
  }
  const std::string text = log.wait_for("does not read its replies");
  REQUIRE_THAT(text, MG_CONTAINS("dropping client 127.0.0.1:"));
  REQUIRE_THAT(text, MG_CONTAINS("(rank 7): it does not read its replies"));
  REQUIRE_THAT(text, MG_CONTAINS("the limit of 64.0 MiB (TCPStoreOptions::max_output_bytes)"));
  REQUIRE(slow.closed_within(10s));
}

TEST_CASE("TCPStore server: a request announcing 1 GiB is refused from its header, holding no "
          "memory") {
  StderrCapture log;
  auto server = make_server();
  RawStoreClient hostile(server->port());
  hostile.hello();
  REQUIRE(hostile.receive(5s)->code == store::kOk);

  const std::string chunk(kMiB, 'y');
  const long long before = resident_bytes();
  hostile.send_bytes(set_header(1u << 30, 3) + "key");
  // Then 256 MiB of the value, or as much as gets through before the server closes.
  std::size_t sent = 0;
  try {
    for (int i = 0; i < 256; ++i) {
      hostile.send_bytes(chunk);
      sent += chunk.size();
    }
  } catch (const Error&) {
    // The server closed the connection: what is expected.
  }
  const long long grown = resident_bytes() - before;
  INFO("sent " << sent / kMiB << " MiB; the process grew by " << grown / (1 << 20) << " MiB");
  CHECK(sent < 256 * kMiB);
  CHECK(grown < 32ll << 20);
  REQUIRE_THAT(log.wait_for("a malformed message"),
               MG_CONTAINS("a malformed message: a message of 1073741833 bytes (the limit is "
                           "67108864)"));
  auto client = make_client(server->port(), 1, 5s);
  client->set("after", "fine");
  REQUIRE(client->get("after") == "fine");
}

TEST_CASE("TCPStore server: partial requests of all clients together stay within "
          "max_buffered_bytes") {
  StderrCapture log;
  TCPStoreOptions options;
  options.max_buffered_bytes = 2 * kMiB;
  auto server = make_server(options);
  RawStoreClient hostile(server->port());
  hostile.hello();
  REQUIRE(hostile.receive(5s)->code == store::kOk);
  // Announced within max_message_bytes (64 MiB), but more than all buffers may hold.
  hostile.send_bytes(set_header(8 * kMiB, 3) + "key");
  try {
    for (int i = 0; i < 8; ++i) hostile.send_bytes(std::string(kMiB, 'z'));
  } catch (const Error&) {
  }
  REQUIRE_THAT(log.wait_for("max_buffered_bytes"),
               MG_CONTAINS("over the limit of 2.0 MiB (TCPStoreOptions::max_buffered_bytes)"));
  REQUIRE(hostile.closed_within(10s));
}

TEST_CASE("TCPStore server: a 64 MiB request of 65536 small arguments is parsed once") {
  auto server = make_server();
  RawStoreClient client(server->port());
  client.hello();
  REQUIRE(client.receive(5s)->code == store::kOk);
  std::string message;
  {
    const std::vector<std::string> keys(store::kMaxArgs, "default/" + std::string(1000, 'k'));
    message = store::encode_message(store::kCheck, keys);
  }
  REQUIRE(message.size() > 63 * kMiB);
  REQUIRE(message.size() <= 64 * kMiB);
  const double cpu_before = process_cpu_seconds();
  client.send_bytes(message);
  const auto reply = client.receive(60s);
  const double cpu = process_cpu_seconds() - cpu_before;
  REQUIRE(reply.has_value());
  REQUIRE(reply->code == store::kValue);
  REQUIRE(reply->args == std::vector<std::string>{"0"});
  // Parsed as it once was (the whole buffer again after each 64 KiB read), this took 15 s
  // of CPU; parsed once it takes a small fraction of a second.
  INFO("CPU time of sending, parsing and answering it: " << cpu << " s");
  CHECK(cpu < 5.0);
}

TEST_CASE("TCPStore server: strangers, garbage, old protocols and keys of no job are refused") {
  StderrCapture log;
  auto server = make_server();

  RawStoreClient stranger(server->port());  // no handshake
  stranger.send(store::kGet, {"default/x"});
  auto reply = stranger.receive(5s);
  REQUIRE(reply.has_value());
  REQUIRE(reply->code == store::kError);
  REQUIRE_THAT(reply->args.at(0), MG_CONTAINS("not a minigrad TCPStore client"));
  REQUIRE(stranger.closed_within(5s));

  RawStoreClient http(server->port());
  http.send_bytes("GET / HTTP/1.1\r\nHost: store\r\n\r\n");
  REQUIRE(http.closed_within(5s));
  REQUIRE_THAT(log.wait_for("arguments (the limit is 65536)"), MG_CONTAINS("a malformed message"));

  RawStoreClient old(server->port());
  old.send(store::kHello, {store::kMagic, "1", "default", "3"});
  reply = old.receive(5s);
  REQUIRE(reply.has_value());
  REQUIRE_THAT(reply->args.at(0), MG_CONTAINS("a client of protocol version '1' (this store speaks 2)"));

  RawStoreClient outside(server->port());
  outside.hello();
  REQUIRE(outside.receive(5s)->code == store::kOk);
  outside.send(store::kSet, {"other-job/x", "v"});
  reply = outside.receive(5s);
  REQUIRE(reply.has_value());
  REQUIRE_THAT(reply->args.at(0),
               MG_CONTAINS("set of key 'other-job/x', which is not under this job's id 'default'"));

  auto client = make_client(server->port(), 1, 5s);
  client->set("still", "serving");
  REQUIRE(client->get("still") == "serving");
}

TEST_CASE("TCPStore server: parked gets and waits do not hold up other clients") {
  auto server = make_server();
  const int port = server->port();
  std::atomic<int> answered{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 20; ++i) {
    waiters.emplace_back([port, i, &answered] {
      auto c = make_client(port, 10 + i, 30s);
      c->get(fmt::format("late/{}", i));
      c->wait({"late/all", "late/all"});  // a key named twice is awaited once
      ++answered;
    });
  }
  auto busy = make_client(port, 1, 5s);  // each call must be answered within 5 s
  for (int i = 0; i < 200; ++i) busy->add("busy", 1);
  REQUIRE(busy->add("busy", 0) == 200);
  REQUIRE(answered == 0);
  for (int i = 0; i < 20; ++i) busy->set(fmt::format("late/{}", i), "v");
  busy->set("late/all", "v");
  for (auto& t : waiters) t.join();
  REQUIRE(answered == 20);
}

TEST_CASE("TCPStore: a value too large for the store is an error naming its key") {
  TCPStoreOptions options;
  options.max_message_bytes = kMiB;
  options.max_data_bytes = 3 * kMiB;
  auto server = make_server(options);
  auto client = make_client(server->port(), 1, 5s, options);
  REQUIRE_THROWS_WITH(client->set("big", std::string(2 * kMiB, 'b')),
                      MG_CONTAINS("TCPStore::set of key 'big': the request takes 2.0 MiB"));
  REQUIRE_THROWS_WITH(client->set("big", std::string(2 * kMiB, 'b')),
                      MG_CONTAINS("over the store's limit of 1.0 MiB for one message"));
  const std::string part(900 * 1024, 'p');
  client->set("a", part);
  client->set("b", part);
  client->set("c", part);
  REQUIRE_THROWS_WITH(client->set("d", part),
                      MG_CONTAINS("key 'd' (921600 bytes) would make the store hold"));
  REQUIRE_THROWS_WITH(client->set("d", part), MG_CONTAINS("(TCPStoreOptions::max_data_bytes)"));
  client->set("a", "small");  // replacing frees room
  client->set("d", part);
  REQUIRE(client->get("d") == part);
}

TEST_CASE("TCPStore server: at the open-file limit new clients are refused clearly, without "
          "spinning") {
  // The server runs in a child whose RLIMIT_NOFILE leaves room for a few clients; this
  // process (its limit untouched) opens more connections than that.
  int to_parent[2], to_child[2];
  REQUIRE(::pipe(to_parent) == 0);
  REQUIRE(::pipe(to_child) == 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(to_parent[0]);
    ::close(to_child[1]);
    int32_t port = -1;
    try {
      rlimit limit{};
      ::getrlimit(RLIMIT_NOFILE, &limit);
      const auto open_now = std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                                          std::filesystem::directory_iterator{});
      limit.rlim_cur = static_cast<rlim_t>(open_now + 12);
      MG_CHECK(::setrlimit(RLIMIT_NOFILE, &limit) == 0, "setrlimit failed");
      TCPStoreOptions options;
      options.run_id = "fd-limit";
      auto server = make_server(options);
      port = server->port();
      [[maybe_unused]] ssize_t n = ::write(to_parent[1], &port, sizeof(port));
      char go = 0;
      n = ::read(to_child[0], &go, 1);  // the parent has hit the limit
      const double before = process_cpu_seconds();
      std::this_thread::sleep_for(1s);
      const double cpu = process_cpu_seconds() - before;
      n = ::write(to_parent[1], &cpu, sizeof(cpu));
      n = ::read(to_child[0], &go, 1);  // the parent is done
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fd-limit child: %s\n", e.what());
      if (port < 0) {
        [[maybe_unused]] ssize_t n = ::write(to_parent[1], &port, sizeof(port));
      }
    }
    _exit(0);
  }
  ::close(to_parent[1]);
  ::close(to_child[0]);
  int32_t port = -1;
  REQUIRE(::read(to_parent[0], &port, sizeof(port)) == sizeof(port));
  REQUIRE(port > 0);

  TCPStoreOptions options;
  options.run_id = "fd-limit";
  std::vector<std::unique_ptr<RawStoreClient>> idle;
  for (int i = 0; i < 30; ++i) idle.push_back(std::make_unique<RawStoreClient>(port));
  CHECK_THROWS_WITH(make_client(port, 5, 3s, options), MG_CONTAINS("is at its limit of open files"));
  CHECK_THROWS_WITH(make_client(port, 5, 3s, options), MG_CONTAINS("RLIMIT_NOFILE"));

  // Still at the limit (the idle connections stay): the server thread must sleep.
  const char go = 1;
  REQUIRE(::write(to_child[1], &go, 1) == 1);
  double cpu = -1;
  REQUIRE(::read(to_parent[0], &cpu, sizeof(cpu)) == sizeof(cpu));
  INFO("the server process used " << cpu << " s of CPU in 1 s at the open-file limit");
  CHECK(cpu < 0.1);

  // Once they leave, a rank gets in (after the server has seen them go).
  idle.clear();
  std::unique_ptr<TCPStore> client;
  for (int attempt = 0; attempt < 50 && !client; ++attempt) {
    try {
      client = make_client(port, 5, 10s, options);
    } catch (const Error&) {
      std::this_thread::sleep_for(100ms);
    }
  }
  REQUIRE(client != nullptr);
  client->set("in", "yes");
  REQUIRE(client->get("in") == "yes");
  client.reset();

  REQUIRE(::write(to_child[1], &go, 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  ::close(to_parent[0]);
  ::close(to_child[1]);
}

#ifdef MINIGRAD_WITH_GLOO

TEST_CASE("TCPStore: a client that never reads and 200 idle connections do not stall a real "
          "2-rank rendezvous") {
  const auto results = run_ranks(2, [](RankContext& ctx) {
    std::vector<std::unique_ptr<RawStoreClient>> idle;
    std::unique_ptr<RawStoreClient> slow;
    if (ctx.rank == 0) {
      for (int i = 0; i < 200; ++i) idle.push_back(std::make_unique<RawStoreClient>(ctx.store->port()));
      slow = std::make_unique<RawStoreClient>(ctx.store->port());
      slow->hello();
      slow->send(store::kSet, {"default/big", std::string(kMiB, 'x')});
      std::string gets;
      for (int i = 0; i < 100; ++i) store::append_message(gets, store::kGet, {"default/big"});
      slow->send_bytes(gets);
      // Time for the server to take it all in: a server that blocks on `slow` is stuck by now.
      std::this_thread::sleep_for(300ms);
    }
    // The Gloo rendezvous goes through the store; 10 s bound every wait on it.
    auto pg = ctx.gloo(10s);
    Tensor t = full(Shape{4}, ctx.rank + 1.0);
    pg->allreduce(t)->wait();
    ctx.report("sum", t);
    if (ctx.rank == 0) ctx.report("slow reader closed", slow->closed_within(10s) ? "yes" : "no");
  }, 60s);
  INFO(describe(results));
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  REQUIRE(results[0].floats("sum") == std::vector<float>(4, 3.0f));
  REQUIRE(results[1].floats("sum") == std::vector<float>(4, 3.0f));
  REQUIRE(results[0].text("slow reader closed") == "yes");
}

#endif  // MINIGRAD_WITH_GLOO
