// TCPStore between threads of one process, on loopback, the server on a free port.
#include <atomic>
#include <limits>
#include <thread>

#include "catch_compat.h"

#include <minigrad/core/error.h>
#include <minigrad/parallel/c10d/store/socket.h>
#include <minigrad/parallel/c10d/store/tcp_store.h>

using namespace mg;
using namespace mg::parallel;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<TCPStore> make_server(std::chrono::milliseconds timeout = 10s) {
  TCPStoreOptions options;
  options.is_server = true;
  options.rank = 0;
  options.timeout = timeout;
  return std::make_unique<TCPStore>("127.0.0.1", 0, options);
}

std::unique_ptr<TCPStore> make_client(int port, int rank,
                                      std::chrono::milliseconds timeout = 10s) {
  TCPStoreOptions options;
  options.rank = rank;
  options.timeout = timeout;
  return std::make_unique<TCPStore>("127.0.0.1", port, options);
}

}  // namespace

TEST_CASE("TCPStore: set, get, add and check between a server and a client") {
  auto server = make_server();
  REQUIRE(server->port() > 0);
  auto client = make_client(server->port(), 1);

  server->set("greeting", "hello");
  REQUIRE(client->get("greeting") == "hello");
  client->set("greeting", "replaced");
  REQUIRE(server->get("greeting") == "replaced");

  // Values are bytes: zeros and high bytes survive.
  const std::string binary("\0\x01\xff\x80 z", 6);
  client->set("binary", binary);
  REQUIRE(server->get("binary") == binary);

  REQUIRE(client->add("counter", 5) == 5);
  REQUIRE(server->add("counter", -2) == 3);
  REQUIRE(client->get("counter") == "3");

  REQUIRE(client->check({"greeting", "counter"}));
  REQUIRE_FALSE(client->check({"greeting", "missing"}));
  client->wait({"greeting", "counter"});  // already set: returns at once
}

TEST_CASE("TCPStore: get and wait block until another client sets the key") {
  auto server = make_server();
  auto waiter = make_client(server->port(), 1);
  auto setter = make_client(server->port(), 2);
  std::string got;
  std::thread t([&] {
    waiter->wait({"a", "b"});
    got = waiter->get("b");
  });
  setter->set("a", "1");
  std::this_thread::sleep_for(20ms);  // let the waiter park on the server (not required)
  setter->set("b", "2");
  t.join();
  REQUIRE(got == "2");
}

TEST_CASE("TCPStore: add is atomic across concurrent clients") {
  auto server = make_server();
  const int port = server->port();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([port, t] {
      auto client = make_client(port, t + 1);
      for (int i = 0; i < 50; ++i) client->add("barrier", 1);
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(server->add("barrier", 0) == 200);
}

TEST_CASE("TCPStore: wait times out with an error naming the key, rank, address and time") {
  auto server = make_server();
  auto client = make_client(server->port(), 3);
  const std::string address = fmt::format("127.0.0.1:{}", server->port());
  REQUIRE_THROWS_WITH(client->wait({"never-set"}, 200ms), MG_CONTAINS("TCPStore::wait"));
  // The connection is closed after a timeout; later calls say why.
  REQUIRE_THROWS_WITH(client->get("x"), MG_CONTAINS("unusable after an earlier failure"));

  auto other = make_client(server->port(), 3);
  try {
    other->get("never-set", 150ms);
    FAIL("get of a key nobody sets returned");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK_THAT(message, MG_CONTAINS("key 'never-set'"));
    CHECK_THAT(message, MG_CONTAINS("rank 3"));
    CHECK_THAT(message, MG_CONTAINS(address));
    CHECK_THAT(message, MG_CONTAINS("timed out after"));
    CHECK_THAT(message, MG_CONTAINS("timeout 0.15 s"));
  }
  // The server and other clients are unaffected.
  auto fresh = make_client(server->port(), 4);
  fresh->set("k", "v");
  REQUIRE(server->get("k") == "v");
}

TEST_CASE("TCPStore: connecting where nobody serves fails after the timeout, naming the address") {
  int port = 0;
  {
    // A port that was free a moment ago and has no listener now.
    net::Socket probe = net::listen_on("127.0.0.1", 0);
    port = net::local_port(probe);
  }
  const std::string address = fmt::format("127.0.0.1:{}", port);
  REQUIRE_THROWS_WITH(make_client(port, 2, 300ms), MG_CONTAINS("could not connect to " + address));
  REQUIRE_THROWS_WITH(make_client(port, 2, 300ms), MG_CONTAINS("TCPStore (rank 2)"));
}

TEST_CASE("TCPStore: a client retries until the server starts") {
  int port = 0;
  {
    net::Socket probe = net::listen_on("127.0.0.1", 0);
    port = net::local_port(probe);
  }
  std::unique_ptr<TCPStore> server;
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    TCPStoreOptions options;
    options.is_server = true;
    options.rank = 0;
    server = std::make_unique<TCPStore>("127.0.0.1", port, options);
    server->set("up", "yes");
  });
  auto client = make_client(port, 1, 20s);
  REQUIRE(client->get("up") == "yes");
  late.join();
}

TEST_CASE("TCPStore: a waiting client hears when the server goes away") {
  auto server = make_server();
  auto client = make_client(server->port(), 1, 30s);
  std::string error;
  std::thread t([&] {
    try {
      client->wait({"never"});
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(50ms);
  server.reset();
  t.join();
  REQUIRE_THAT(error, MG_CONTAINS("TCPStore::wait"));
  REQUIRE_THAT(error, MG_CONTAINS("rank 1"));
}

TEST_CASE("TCPStore: invalid arguments are refused with clear errors") {
  REQUIRE_THROWS_WITH(make_client(0, 1), MG_CONTAINS("a client needs the server's port"));
  TCPStoreOptions options;
  REQUIRE_THROWS_WITH(TCPStore("", 1234, options), MG_CONTAINS("empty host name"));
  REQUIRE_THROWS_WITH(TCPStore("127.0.0.1", 70000, options), MG_CONTAINS("outside [0, 65535]"));
  auto server = make_server();
  server->set("text", "abc");
  REQUIRE_THROWS_WITH(server->add("text", 1), MG_CONTAINS("not an integer counter"));
}

TEST_CASE("TCPStore: add that would overflow int64 is an error naming the key, and the counter stays") {
  auto server = make_server();
  auto client = make_client(server->port(), 1);
  const int64_t max = std::numeric_limits<int64_t>::max();
  const int64_t min = std::numeric_limits<int64_t>::min();
  REQUIRE(client->add("up", max) == max);
  REQUIRE_THROWS_WITH(client->add("up", 1), MG_CONTAINS("TCPStore::add of key 'up'"));
  REQUIRE_THROWS_WITH(client->add("up", 1),
                      MG_CONTAINS("key 'up' holds 9223372036854775807; adding 1 would overflow "
                                  "int64, so it is left unchanged"));
  REQUIRE(client->add("up", 0) == max);
  REQUIRE(client->add("up", -max) == 0);
  REQUIRE(client->add("down", min) == min);
  REQUIRE_THROWS_WITH(client->add("down", -1),
                      MG_CONTAINS("key 'down' holds -9223372036854775808; adding -1 would overflow"));
  REQUIRE(server->get("down") == std::to_string(min));
  // The connection stays in step after an error reply.
  client->set("after", "ok");
  REQUIRE(client->get("after") == "ok");
}

TEST_CASE("TCPStore: a rank of another job is refused with a message naming both ids") {
  TCPStoreOptions server_options;
  server_options.is_server = true;
  server_options.rank = 0;
  server_options.run_id = "job-a";
  TCPStore server("127.0.0.1", 0, server_options);
  server.set("rank_0", "job a's address");

  TCPStoreOptions other;
  other.rank = 1;
  other.run_id = "job-b";
  other.timeout = 5s;
  try {
    TCPStore intruder("127.0.0.1", server.port(), other);
    FAIL("a rank of job-b joined the store of job-a");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK_THAT(message, MG_CONTAINS(fmt::format("TCPStore (rank 1): the store at 127.0.0.1:{} "
                                                "refused this rank", server.port())));
    CHECK_THAT(message, MG_CONTAINS("rank 1 of job 'job-b' reached the store of job 'job-a'"));
    CHECK_THAT(message, MG_CONTAINS("two jobs were given one MASTER_PORT"));
  }
  // Job a's keys are untouched and its own ranks get in.
  TCPStoreOptions same = other;
  same.run_id = "job-a";
  TCPStore member("127.0.0.1", server.port(), same);
  REQUIRE(member.get("rank_0") == "job a's address");
  REQUIRE(member.run_id() == "job-a");
}

TEST_CASE("TCPStore: a second server on a taken port says the port is in use") {
  auto first = make_server();
  TCPStoreOptions options;
  options.is_server = true;
  options.rank = 0;
  options.run_id = "second-job";
  REQUIRE_THROWS_WITH(TCPStore("127.0.0.1", first->port(), options),
                      MG_CONTAINS(fmt::format("TCPStore (rank 0, job 'second-job'): cannot serve "
                                              "the store on 127.0.0.1:{}",
                                              first->port())));
  REQUIRE_THROWS_WITH(TCPStore("127.0.0.1", first->port(), options),
                      MG_CONTAINS("give each job a MASTER_PORT of its own"));
}

TEST_CASE("TCPStore: run ids are checked") {
  TCPStoreOptions options;
  options.is_server = true;
  options.run_id = "";
  REQUIRE_THROWS_WITH(TCPStore("127.0.0.1", 0, options), MG_CONTAINS("a run id has 1 to 128 characters"));
  options.run_id = "has space";
  REQUIRE_THROWS_WITH(TCPStore("127.0.0.1", 0, options), MG_CONTAINS("has the character ' '"));
  options.run_id = "a1b2-c3d4:5e_6.f";
  TCPStore fine("127.0.0.1", 0, options);
  fine.set("k", "v");
  REQUIRE(fine.get("k") == "v");
}
