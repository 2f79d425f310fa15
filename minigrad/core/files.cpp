#include <minigrad/core/files.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>
#include <ctime>

#include <minigrad/core/error.h>

namespace mg::files {
namespace {

std::string errno_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

// The directory holding `path`: where its temporary file goes, and what is fsync'ed after
// the rename so that the new name itself is durable.
std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "'ck' (a symbolic link to 'runs/ck')" when links were followed, else "'ck'".
std::string describe(const std::string& path, const std::string& target) {
  if (target == path) return fmt::format("'{}'", path);
  return fmt::format("'{}' (a symbolic link to '{}')", path, target);
}

// 0, or the errno of the write that failed. write() may write less than asked.
int write_all(int fd, std::string_view bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

// ---- the temporary files of writes in progress, for remove_temp_files_in_progress ----
//
// A signal handler may read this table at any moment, in any thread, so it is a fixed
// array of slots whose state is a lock-free atomic: free -> claimed (the writer copies the
// path in) -> ready (a handler may remove the file) -> free again, or taken by a handler,
// which keeps the slot for good (the process is about to end). A write that finds no free
// slot (more than kSlots at once) simply is not covered.
constexpr int kSlots = 16;
constexpr std::size_t kMaxTempPath = 4096;
enum SlotState : int { kFree = 0, kClaimed = 1, kReady = 2, kTaken = 3 };
struct Slot {
  std::atomic<int> state{kFree};
  char path[kMaxTempPath];
};
static_assert(std::atomic<int>::is_always_lock_free, "signal handlers need lock-free atomics");
Slot temp_slots[kSlots];

class TempRegistration {
 public:
  explicit TempRegistration(const std::string& path) {
    if (path.size() >= kMaxTempPath) return;
    for (int i = 0; i < kSlots; ++i) {
      int expected = kFree;
      if (!temp_slots[i].state.compare_exchange_strong(expected, kClaimed)) continue;
      std::memcpy(temp_slots[i].path, path.c_str(), path.size() + 1);
      temp_slots[i].state.store(kReady, std::memory_order_release);
      slot_ = i;
      return;
    }
  }
  ~TempRegistration() {
    if (slot_ < 0) return;
    int expected = kReady;
    temp_slots[slot_].state.compare_exchange_strong(expected, kFree);
  }
  TempRegistration(const TempRegistration&) = delete;
  TempRegistration& operator=(const TempRegistration&) = delete;

 private:
  int slot_ = -1;
};

// Creates "<target>.tmp.<pid>.<n>" with O_EXCL, so that it is always a file of our own:
// never one that another process (another container's process of the same pid, say) is
// writing, nor a link someone planted there. Returns 0 and sets `fd` and `name`, or the
// errno of the failed open (`name` then holds the name tried).
int create_temp_file(const std::string& target, FileDescriptor& fd, std::string& name) {
  static std::atomic<uint64_t> counter{
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  for (int attempt = 0;; ++attempt) {
    const uint64_t n = counter.fetch_add(0x9E3779B97F4A7C15ull);
    name = fmt::format("{}.tmp.{}.{:06x}", target, ::getpid(), (n >> 40) & 0xFFFFFF);
    fd = FileDescriptor(
        ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd.get() >= 0) return 0;
    if (errno != EEXIST || attempt == 100) return errno;
  }
}

std::atomic<double> write_pause_seconds{0.0};

// Sleeps `seconds` whatever signals arrive meanwhile (a handler that ends the process
// still does).
void pause_for(double seconds) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
  for (auto now = std::chrono::steady_clock::now(); now < until;
       now = std::chrono::steady_clock::now()) {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(until - now);
    timespec ts{static_cast<time_t>(left.count() / 1000000000),
                static_cast<long>(left.count() % 1000000000)};
    ::nanosleep(&ts, nullptr);
  }
}

// The kernel's fs.protected_symlinks rule, which following links by hand would bypass: a
// symbolic link in a sticky, world-writable directory (/tmp) is followed only if this
// process owns it or the directory's owner does. Otherwise another user may have planted
// it there, pointing at a file of ours, for us to overwrite.
void check_link_may_be_followed(const char* op, const std::string& path, const std::string& link,
                                const struct stat& link_stat) {
  const std::string dir = directory_of(link);
  struct stat dir_stat {};
  if (::stat(dir.c_str(), &dir_stat) != 0) return;  // the lookup of the link itself fails next
  const bool shared = (dir_stat.st_mode & S_ISVTX) != 0 && (dir_stat.st_mode & S_IWOTH) != 0;
  if (!shared || link_stat.st_uid == ::geteuid() || link_stat.st_uid == dir_stat.st_uid) return;
  MG_FAIL(
      "{}: cannot write '{}': '{}' is a symbolic link owned by another user (uid {}) in the "
      "shared directory '{}' (sticky and world-writable, owned by uid {}); such a link is not "
      "followed (the kernel's protected_symlinks rule), since anyone could have planted it. "
      "Remove it or write elsewhere (nothing was written)",
      op, path, link, link_stat.st_uid, dir, dir_stat.st_uid);
}

}  // namespace

void set_write_pause_for_testing(double seconds) {
  write_pause_seconds.store(seconds > 0 && seconds < 3600 ? seconds : 0.0);
}

// ---------------------------------------------------------------- FileDescriptor

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

int FileDescriptor::close() {
  if (fd_ < 0) return 0;
  const int rc = ::close(fd_);
  fd_ = -1;
  return rc == 0 ? 0 : errno;
}

const char* file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

// ---------------------------------------------------------------- reading

OpenedFile open_for_reading(const char* op, const std::string& path) {
  // O_NONBLOCK: open() of a FIFO without a writer returns at once instead of waiting for
  // one (forever, when nobody comes), and so does a device that waits for a carrier.
  // O_NOCTTY: a terminal named by mistake must not become our controlling terminal.
  OpenedFile file;
  file.fd = FileDescriptor(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  MG_CHECK(file.fd.get() >= 0, "{}: cannot open '{}': {}", op, path, errno_text(errno));
  struct stat st {};
  MG_CHECK(::fstat(file.fd.get(), &st) == 0, "{}: cannot stat '{}': {}", op, path,
           errno_text(errno));
  MG_CHECK(S_ISREG(st.st_mode),
           "{}: '{}' is not a regular file but {}; only regular files are read", op, path,
           file_type_name(st.st_mode));
  // A regular file never blocks, but reads of it are not meant to see EAGAIN either.
  const int flags = ::fcntl(file.fd.get(), F_GETFL);
  MG_CHECK(flags >= 0 && ::fcntl(file.fd.get(), F_SETFL, flags & ~O_NONBLOCK) == 0,
           "{}: cannot read '{}': fcntl failed: {}", op, path, errno_text(errno));
  file.size = static_cast<uint64_t>(st.st_size);
  return file;
}

void read_exactly(const char* op, const std::string& path, int fd, uint64_t offset, void* out,
                  std::size_t n) {
  auto* bytes = static_cast<char*>(out);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, bytes + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    MG_CHECK(got >= 0, "{}: reading '{}' failed: {}", op, path, errno_text(errno));
    MG_CHECK(got > 0,
             "{}: reading '{}' failed: the file ends at byte {}, before the {} bytes at offset "
             "{} that it was opened with (it shrank while being read?)",
             op, path, offset + done, n, offset);
    done += static_cast<std::size_t>(got);
  }
}

// ---------------------------------------------------------------- writing

std::string write_target(const char* op, const std::string& path) {
  // Linux follows at most 40 links in one path lookup (ELOOP); so does this.
  constexpr int kMaxLinks = 40;
  std::string current = path;
  for (int links = 0;; ++links) {
    struct stat st {};
    if (::lstat(current.c_str(), &st) != 0) {
      // Nothing there (yet): the write creates it. A missing or unusable directory is
      // reported when the temporary file cannot be created in it.
      if (errno == ENOENT || errno == ENOTDIR) return current;
      MG_FAIL("{}: cannot write {}: {}", op, describe(path, current), errno_text(errno));
    }
    if (S_ISREG(st.st_mode)) return current;
    if (!S_ISLNK(st.st_mode)) {
      if (current == path)
        MG_FAIL(
            "{}: cannot write '{}': it is {}, not a regular file; only regular files are "
            "replaced (nothing was written)",
            op, path, file_type_name(st.st_mode));
      MG_FAIL(
          "{}: cannot write '{}': it is a symbolic link to '{}', which is {}, not a regular "
          "file; only regular files are replaced (nothing was written)",
          op, path, current, file_type_name(st.st_mode));
    }
    MG_CHECK(links < kMaxLinks,
             "{}: cannot write '{}': more than {} symbolic links (a loop?); the last was '{}'", op,
             path, kMaxLinks, current);
    check_link_may_be_followed(op, path, current, st);
    std::string link(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = ::readlink(current.c_str(), link.data(), link.size());
    MG_CHECK(n >= 0, "{}: cannot write '{}': reading the symbolic link '{}' failed: {}", op, path,
             current, errno_text(errno));
    link.resize(static_cast<std::size_t>(n));
    // A relative link counts from the directory that holds it.
    current = !link.empty() && link[0] == '/' ? link : directory_of(current) + "/" + link;
  }
}

void write_atomically(const char* op, const std::string& path, std::string_view bytes) {
  const std::string target = write_target(op, path);
  struct stat old {};
  const bool replacing = ::stat(target.c_str(), &old) == 0;

  FileDescriptor fd;
  std::string tmp;
  if (const int error = create_temp_file(target, fd, tmp))
    MG_FAIL("{}: cannot write {}: creating the temporary file '{}' failed: {}", op,
            describe(path, target), tmp, errno_text(error));
  // From here a signal handler may remove the file (see remove_temp_files_in_progress);
  // the few instructions since the open are the one moment that it cannot.
  const TempRegistration registration(tmp);

  // The new file keeps the old one's permission bits (a chmod 600 stays 600; set-user-ID
  // and the like are not carried over). A file system without permissions refuses fchmod,
  // which is no reason to fail the write.
  if (replacing) (void)::fchmod(fd.get(), old.st_mode & 0777);
  int error = write_all(fd.get(), bytes);
  std::string step = fmt::format("writing the temporary file '{}'", tmp);
  if (error == 0 && ::fsync(fd.get()) != 0) {
    error = errno;
    step = fmt::format("flushing (fsync) the temporary file '{}'", tmp);
  }
  const int close_error = fd.close();
  if (const double pause = write_pause_seconds.load(); pause > 0 && error == 0) pause_for(pause);
  if (error == 0 && close_error != 0) {
    error = close_error;
    step = fmt::format("closing the temporary file '{}'", tmp);
  }
  // The target was checked before the write; look again just before the rename, which
  // would replace whatever it finds there (a FIFO put in its place meanwhile).
  struct stat now {};
  if (error == 0 && ::lstat(target.c_str(), &now) == 0 && !S_ISREG(now.st_mode)) {
    ::unlink(tmp.c_str());
    MG_FAIL(
        "{}: cannot write {}: it became {} during the write; only regular files are "
        "replaced (nothing was written)",
        op, describe(path, target), file_type_name(now.st_mode));
  }
  if (error == 0 && ::rename(tmp.c_str(), target.c_str()) != 0) {
    error = errno;
    step = fmt::format("renaming the temporary file '{}' over it", tmp);
  }
  if (error != 0) {
    ::unlink(tmp.c_str());
    MG_FAIL("{}: cannot write {}: {} failed: {} ('{}' was not changed)", op, describe(path, target),
            step, errno_text(error), path);
  }

  // The data is in place; syncing the directory makes the rename survive a power cut.
  // Some file systems refuse fsync on directories, which is no reason to fail the write.
  FileDescriptor dir(::open(directory_of(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
}

void check_writable(const char* op, const std::string& path) {
  MG_CHECK(!path.empty(), "{}: the path is empty", op);
  const std::string target = write_target(op, path);
  const std::string dir = directory_of(target);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT)
      MG_FAIL("{}: cannot write {}: the directory '{}' does not exist", op, describe(path, target),
              dir);
    MG_FAIL("{}: cannot write {}: '{}' is not a directory one can write in: {}", op,
            describe(path, target), dir, errno_text(errno));
  }
  MG_CHECK(S_ISDIR(st.st_mode), "{}: cannot write {}: '{}' is {}, not a directory", op,
           describe(path, target), dir, file_type_name(st.st_mode));
  FileDescriptor fd;
  std::string tmp;
  if (const int error = create_temp_file(target, fd, tmp))
    MG_FAIL("{}: cannot write {}: creating a file in '{}' failed: {}", op, describe(path, target),
            dir, errno_text(error));
  fd.close();
  ::unlink(tmp.c_str());
}

FileIdentity file_identity(const char* op, const std::string& path) {
  const std::string target = write_target(op, path);
  FileIdentity id;
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    id.device = st.st_dev;
    id.inode = st.st_ino;
    return id;
  }
  MG_CHECK(errno == ENOENT, "{}: cannot look up {}: {}", op, describe(path, target),
           errno_text(errno));
  // Not there yet: the file is the entry that the write will create, a name in a
  // directory (itself reached through any links on the way).
  const std::string dir = directory_of(target);
  MG_CHECK(::stat(dir.c_str(), &st) == 0, "{}: cannot write {}: the directory '{}': {}", op,
           describe(path, target), dir, errno_text(errno));
  id.device = st.st_dev;
  id.inode = st.st_ino;
  id.name = base_name(target);
  return id;
}

std::vector<StaleTempFile> stale_temp_files(const std::string& path) {
  std::string target = path;
  try {
    target = write_target("stale_temp_files", path);
  } catch (const Error&) {
  }
  const std::string dir = directory_of(target);
  const std::string prefix = base_name(target) + ".tmp.";
  std::vector<StaleTempFile> out;
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) return out;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    // "<pid>" or "<pid>.<anything>"
    const std::string rest = name.substr(prefix.size());
    const std::size_t digits = std::min(rest.find_first_not_of("0123456789"), rest.size());
    if (digits == 0 || digits > 9 || (digits < rest.size() && rest[digits] != '.')) continue;
    StaleTempFile stale;
    stale.path = dir == "." && path.find('/') == std::string::npos ? name : dir + "/" + name;
    stale.pid = std::stol(rest.substr(0, digits));
    stale.running =
        stale.pid > 0 && (::kill(static_cast<pid_t>(stale.pid), 0) == 0 || errno == EPERM);
    out.push_back(std::move(stale));
  }
  ::closedir(listing);
  std::sort(out.begin(), out.end(),
            [](const StaleTempFile& a, const StaleTempFile& b) { return a.path < b.path; });
  return out;
}

void remove_temp_files_in_progress() noexcept {
  for (Slot& slot : temp_slots) {
    int expected = kReady;
    if (slot.state.compare_exchange_strong(expected, kTaken)) ::unlink(slot.path);
  }
}

}  // namespace mg::files
