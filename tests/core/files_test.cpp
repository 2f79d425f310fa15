// minigrad/core/files.h: the writer that never replaces what is not a regular file, the
// pre-flight check, stale temporary files, the signal-time cleanup, and the reader that
// never blocks on a special file.
#include "catch_compat.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <minigrad/core/error.h>
#include <minigrad/core/files.h>

#include "special_files.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
namespace files = mg::files;
using mg::testing::TempDir;

namespace {

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

TEST_CASE("files::write_atomically: creates, replaces, and leaves nothing else behind") {
  TempDir dir;
  const std::string path = dir / "out.txt";
  files::write_atomically("test", path, "first");
  CHECK(read_text(path) == "first");
  files::write_atomically("test", path, std::string(100000, 'x'));
  CHECK(read_text(path) == std::string(100000, 'x'));
  files::write_atomically("test", path, "");
  CHECK(read_text(path).empty());
  CHECK(listing(dir.path()) == std::vector<std::string>{"out.txt"});
}

TEST_CASE("files::write_atomically: refuses what is not a regular file, naming op and path") {
  TempDir dir;
  const std::string fifo = dir / "fifo";
  mg::testing::make_fifo(fifo);
  REQUIRE_THROWS_WITH(files::write_atomically("--metrics", fifo, "x"),
                      MG_CONTAINS("--metrics: cannot write '" + fifo +
                                  "': it is a named pipe "
                                  "(FIFO), not a regular file; only regular files are replaced "
                                  "(nothing was written)"));
  CHECK(mg::testing::is_fifo(fifo));
  const std::string link = dir / "link";
  fs::create_symlink(fifo, link);
  REQUIRE_THROWS_WITH(
      files::write_atomically("--plot", link, "x"),
      MG_CONTAINS("--plot: cannot write '" + link + "': it is a symbolic link to '" + fifo +
                  "', which is a named pipe (FIFO), not a regular file"));
  CHECK(listing(dir.path()) == std::vector<std::string>{"fifo", "link"});
  // A directory that does not exist: the temporary file cannot be created.
  const std::string nowhere = dir / "no/such/out.txt";
  REQUIRE_THROWS_WITH(files::write_atomically("test", nowhere, "x"),
                      MG_CONTAINS("test: cannot write '" + nowhere +
                                  "': creating the temporary "
                                  "file '" +
                                  nowhere + ".tmp.") &&
                          MG_CONTAINS("failed: No such file or directory"));
}

TEST_CASE("files::write_atomically: a link's target is replaced in its own directory") {
  TempDir dir;
  fs::create_directory(dir / "data");
  const std::string real = dir / "data/out.txt";
  const std::string link = dir / "out.txt";
  fs::create_symlink(real, link);  // absolute, dangling until the first write
  files::write_atomically("test", link, "through the link");
  CHECK(read_text(real) == "through the link");
  CHECK(fs::is_symlink(fs::symlink_status(link)));
  CHECK(files::write_target("test", link) == real);
  CHECK(files::write_target("test", real) == real);
  CHECK(listing(dir / "data") == std::vector<std::string>{"out.txt"});
}

TEST_CASE("files::check_writable: the pre-flight check names the fault and leaves nothing") {
  TempDir dir;
  files::check_writable("--save", dir / "new.safetensors");  // nothing there yet: fine
  write_text(dir / "old.csv", "kept");
  files::check_writable("--metrics", dir / "old.csv");  // a regular file: fine, unchanged
  CHECK(read_text(dir / "old.csv") == "kept");
  CHECK(listing(dir.path()) == std::vector<std::string>{"old.csv"});

  const std::string missing = dir / "missing/ck.safetensors";
  REQUIRE_THROWS_WITH(files::check_writable("--save", missing),
                      MG_CONTAINS("--save: cannot write '" + missing + "': the directory '" +
                                  (dir / "missing") + "' does not exist"));
  const std::string under_file = dir / "old.csv/m.csv";
  REQUIRE_THROWS_WITH(files::check_writable("--metrics", under_file),
                      MG_CONTAINS("--metrics: cannot write '" + under_file + "': '" +
                                  (dir / "old.csv") + "' is a regular file, not a directory"));
  fs::create_directory(dir / "plots");
  REQUIRE_THROWS_WITH(files::check_writable("--plot", dir / "plots"),
                      MG_CONTAINS("--plot: cannot write '" + (dir / "plots") +
                                  "': it is a directory, not a regular file"));
  REQUIRE_THROWS_WITH(files::check_writable("--save", ""),
                      MG_CONTAINS("--save: the path is empty"));

  // A directory one may not write in. Root may write anywhere, so only others see this.
  if (::geteuid() != 0) {
    fs::create_directory(dir / "read-only");
    fs::permissions(dir / "read-only", fs::perms::owner_read | fs::perms::owner_exec);
    REQUIRE_THROWS_WITH(
        files::check_writable("--save", dir / "read-only/ck"),
        MG_CONTAINS("creating a file in '" + (dir / "read-only") + "' failed: Permission denied"));
    fs::permissions(dir / "read-only", fs::perms::owner_all);
  } else {
    WARN("running as root: the unwritable-directory case cannot be tested");
  }
  std::vector<std::string> left = listing(dir.path());
  left.erase(std::remove(left.begin(), left.end(), "read-only"), left.end());
  CHECK(left == std::vector<std::string>{"old.csv", "plots"});
}

TEST_CASE("files::stale_temp_files: names the leftovers of a target, with their pids") {
  TempDir dir;
  const std::string target = dir / "ck.safetensors";
  const std::string dead = target + ".tmp.999999999";  // no such process
  const std::string alive = target + ".tmp." + std::to_string(::getpid()) + ".1f2e3d";
  for (const std::string& name : {dead, alive, target + ".tmp.12x", target + ".tmpx",
                                  target + ".tmp.", dir / "other.safetensors.tmp.5"})
    write_text(name, "partial");
  const auto stale = files::stale_temp_files(target);
  REQUIRE(stale.size() == 2);
  CHECK(stale[0].path == alive);
  CHECK(stale[0].pid == ::getpid());
  CHECK(stale[0].running);
  CHECK(stale[1].path == dead);
  CHECK(stale[1].pid == 999999999);
  CHECK_FALSE(stale[1].running);
  // They are named, not removed.
  CHECK(fs::exists(dead));
  CHECK(fs::exists(alive));

  // Through a link, the leftovers sit beside the file it points to.
  fs::create_directory(dir / "links");
  fs::create_symlink(target, dir / "links/ck.safetensors");
  CHECK(files::stale_temp_files(dir / "links/ck.safetensors").size() == 2);
  CHECK(files::stale_temp_files(dir / "missing/ck").empty());
}

TEST_CASE("files::remove_temp_files_in_progress: a signal during a write leaves no temp file") {
  TempDir dir;
  const std::string path = dir / "big.bin";
  // The child's write runs into a file size limit, whose signal (SIGXFSZ) arrives in the
  // middle of the write; its handler does what a program's last-chance handler does.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    struct sigaction action {};
    action.sa_handler = [](int) {
      files::remove_temp_files_in_progress();
      ::_exit(42);
    };
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGXFSZ, &action, nullptr);
    struct rlimit limit {};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 4096;
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      files::write_atomically("test", path, std::string(1 << 20, 'x'));
    } catch (...) {
    }
    ::_exit(1);  // the write did not run into the limit
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 42);
  CHECK(listing(dir.path()).empty());
}

TEST_CASE("files::open_for_reading: regular files only, and never a blocking open") {
  TempDir dir;
  write_text(dir / "a.bin", "12345");
  files::OpenedFile file = files::open_for_reading("test", dir / "a.bin");
  CHECK(file.size == 5);
  char buffer[3] = {};
  files::read_exactly("test", dir / "a.bin", file.fd.get(), 2, buffer, 3);
  CHECK(std::string(buffer, 3) == "345");
  REQUIRE_THROWS_WITH(files::read_exactly("test", dir / "a.bin", file.fd.get(), 4, buffer, 3),
                      MG_CONTAINS("test: reading '" + (dir / "a.bin") +
                                  "' failed: the file ends at byte 5, before the 3 bytes at "
                                  "offset 4"));

  const std::string fifo = dir / "fifo";
  mg::testing::make_fifo(fifo);
  const mg::testing::FifoWatchdog watchdog(fifo, 3.0);
  const double seconds = mg::testing::seconds_taken([&] {
    REQUIRE_THROWS_WITH(files::open_for_reading("--resume", fifo),
                        MG_CONTAINS("--resume: '" + fifo +
                                    "' is not a regular file but a named "
                                    "pipe (FIFO); only regular files are read"));
  });
  CHECK(seconds < 2.0);
  REQUIRE_THROWS_WITH(files::open_for_reading("test", "/dev/null"),
                      MG_CONTAINS("'/dev/null' is not a regular file but a character device"));
  REQUIRE_THROWS_WITH(
      files::open_for_reading("test", dir / "absent"),
      MG_CONTAINS("test: cannot open '" + (dir / "absent") + "': No such file or directory"));
}

TEST_CASE("files::file_identity: one file however it is spelled, linked or not yet there") {
  TempDir dir;
  fs::create_directory(dir / "sub");
  write_text(dir / "ck", "checkpoint");
  const files::FileIdentity ck = files::file_identity("test", dir / "ck");
  CHECK(ck.name.empty());
  CHECK(files::file_identity("test", dir.path() + "/./ck") == ck);
  CHECK(files::file_identity("test", dir / "sub/../ck") == ck);
  fs::create_symlink(dir / "ck", dir / "soft");
  CHECK(files::file_identity("test", dir / "soft") == ck);
  fs::create_hard_link(dir / "ck", dir / "hard");
  CHECK(files::file_identity("test", dir / "hard") == ck);
  CHECK(files::file_identity("test", dir / "sub/other") != ck);

  // Not there yet: the directory (reached through a link or not) and the name.
  fs::create_directory_symlink(dir / "sub", dir / "sublink");
  const files::FileIdentity fresh = files::file_identity("test", dir / "sub/new.json");
  CHECK(fresh.name == "new.json");
  CHECK(files::file_identity("test", dir / "sublink/new.json") == fresh);
  CHECK(files::file_identity("test", dir / "sub/./new.json") == fresh);
  CHECK(files::file_identity("test", dir / "sub/new2.json") != fresh);
  // A dangling link names the file that the write would create.
  fs::create_symlink(dir / "sub/new.json", dir / "dangling");
  CHECK(files::file_identity("test", dir / "dangling") == fresh);
  CHECK(listing(dir / "sub").empty());  // nothing was created

  REQUIRE_THROWS_WITH(files::file_identity("--save", dir / "missing/x"),
                      MG_CONTAINS("--save: cannot write") && MG_CONTAINS("missing"));
}

// fs.protected_symlinks: a link that another user planted in a sticky, world-writable
// directory is not followed. Changing a link's owner takes root; as anyone else, the
// case that must still work (one's own link there) is checked alone.
TEST_CASE("files::write_atomically: refuses another user's link in a sticky world-writable "
          "directory") {
  TempDir dir;
  const std::string shared = dir / "shared";
  fs::create_directory(shared);
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);
  const std::string real = dir / "mine.txt";
  write_text(real, "precious");
  const std::string link = shared + "/out.txt";
  fs::create_symlink(real, link);
  // One's own link there is followed.
  files::write_atomically("test", link, "mine");
  CHECK(read_text(real) == "mine");
  if (::geteuid() != 0) {
    SUCCEED("not root: a link of another user cannot be made here");
    return;
  }
  // The directory belongs to root; a link of uid 4242 in it is refused...
  REQUIRE(::lchown(link.c_str(), 4242, 4242) == 0);
  REQUIRE_THROWS_WITH(
      files::write_atomically("--save", link, "overwritten"),
      MG_CONTAINS("--save: cannot write '" + link + "'") &&
          MG_CONTAINS("is a symbolic link owned by another user (uid 4242) in the shared "
                      "directory") &&
          MG_CONTAINS("protected_symlinks") && MG_CONTAINS("nothing was written"));
  REQUIRE_THROWS_WITH(files::check_writable("--save", link), MG_CONTAINS("protected_symlinks"));
  CHECK(read_text(real) == "mine");
  CHECK(listing(shared) == std::vector<std::string>{"out.txt"});
  // ...unless that user owns the directory too, or the directory is not world-writable.
  REQUIRE(::chown(shared.c_str(), 4242, 4242) == 0);
  files::write_atomically("test", link, "allowed: the directory's owner made the link");
  REQUIRE(::chown(shared.c_str(), 0, 0) == 0);
  REQUIRE(::chmod(shared.c_str(), 0755) == 0);
  files::write_atomically("test", link, "allowed: not a shared directory");
  CHECK(read_text(real) == "allowed: not a shared directory");
}
