// Files that cannot be clobbered and readers that cannot block: the one place where
// minigrad opens a path a user gave it. Every writer (checkpoints, IDX files, the sample
// programs' metrics and plots) and every reader (safetensors, IDX) goes through here, so
// the rules hold everywhere at once:
//
// Writing `path` (write_atomically):
//   - the bytes go to a temporary file "<target>.tmp.<pid>.<n>" beside the target,
//     which is fsync'ed and renamed over it: a reader sees the old file or the new one,
//     never half of one, and a failed write leaves the old file as it was;
//   - an existing target that is not a regular file (a directory, a FIFO, a device such
//     as /dev/null, a socket) is refused: a rename would replace it;
//   - a symbolic link is followed: the file it points to is replaced, in that file's
//     directory, and the link stays a link (as `cp` or `>` would write through it);
//     except a link that another user owns in a sticky, world-writable directory such as
//     /tmp (unless that user owns the directory too), which is refused, as the kernel's
//     fs.protected_symlinks refuses to follow it: anyone could have planted it there;
//   - the replaced file keeps its permission bits;
//   - the temporary file is removed on every error path, and a signal handler can remove
//     the ones still in progress (remove_temp_files_in_progress) before the process dies.
//   A process killed outright (kill -9, a power cut) still leaves its temporary file
//   behind; stale_temp_files finds those, so a program can name them when it starts.
//
// Reading `path` (open_for_reading): opened with O_NONBLOCK, so that a FIFO without a
// writer or a device cannot stall the open, then fstat'ed; anything but a regular file is
// refused before a single byte is read, and the descriptor is then made blocking again.
//
// Every failure is an mg::Error that begins with the caller's `op` (a function name, or a
// program's flag such as "--save") and names the path and the fault.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mg::files {

// A file descriptor, closed on every path out of a scope.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  // Gives the descriptor up (to zlib's gzdopen, say), which then closes it.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes now; returns close()'s errno, or 0. A failed close can mean lost data, so
  // writers check it.
  int close();

 private:
  int fd_ = -1;
};

// "a directory", "a FIFO (named pipe)", "a character device", ...: what `mode` (st_mode)
// says a file is, for messages.
const char* file_type_name(mode_t mode);

// ---------------------------------------------------------------- reading

struct OpenedFile {
  FileDescriptor fd;
  uint64_t size = 0;  // st_size when it was opened
};

// Opens a regular file for reading without blocking on anything else (see above).
OpenedFile open_for_reading(const char* op, const std::string& path);

// Reads exactly `n` bytes at `offset` (pread, so the file position does not matter);
// mg::Error naming the path if the file ends first (it shrank while being read) or a read
// fails.
void read_exactly(const char* op, const std::string& path, int fd, uint64_t offset, void* out,
                  std::size_t n);

// ---------------------------------------------------------------- writing

// Writes `bytes` to `path` atomically, as described above.
void write_atomically(const char* op, const std::string& path, std::string_view bytes);

// A pre-flight check, for a program to run before it starts work whose result it will
// write to `path`: the path resolves (symbolic links followed) to a regular file or to
// nothing yet, in an existing directory where a file can be created (it creates and
// removes a temporary file there, the only check that sees read-only mounts, ACLs and
// quotas as the write will). mg::Error naming `op`, the path and the fault otherwise.
void check_writable(const char* op, const std::string& path);

// The file that write_atomically(path) would replace: `path` itself, or where its chain of
// symbolic links ends. mg::Error if that exists and is not a regular file, or if the links
// loop.
std::string write_target(const char* op, const std::string& path);

// What a path names on disk, to tell whether two paths are one file whatever their
// spelling ("ck" and "./ck", a symbolic link, a hard link, a directory reached through a
// link): the device and inode of the file that write_target(path) reaches, or, for a
// file that does not exist yet, the device and inode of the directory it would be created
// in and its name there. Two paths are one file exactly when their identities are equal.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  std::string name;  // the name in the directory (device, inode) when nothing exists yet
  bool operator==(const FileIdentity& o) const {
    return device == o.device && inode == o.inode && name == o.name;
  }
  bool operator!=(const FileIdentity& o) const { return !(*this == o); }
  bool operator<(const FileIdentity& o) const {
    if (device != o.device) return device < o.device;
    if (inode != o.inode) return inode < o.inode;
    return name < o.name;
  }
};

// mg::Error naming `op` and the path when write_target fails or the directory of a file
// that does not exist yet cannot be looked up.
FileIdentity file_identity(const char* op, const std::string& path);

// A temporary file that an earlier write of the same target left behind (its process was
// killed before it could rename or remove it).
struct StaleTempFile {
  std::string path;
  long pid = 0;          // the process that was writing it
  bool running = false;  // whether a process of that pid runs now, on this machine
};

// The "<target>.tmp.<pid>[.<n>]" files beside write_target(path), in name order; empty
// when there are none or the directory cannot be listed. None is removed: a process of
// another machine or container that shares the directory may still be writing one, and
// its pid says nothing here.
std::vector<StaleTempFile> stale_temp_files(const std::string& path);

// For tests of what a stop does to a save in progress (a launcher's escalation, say):
// every write_atomically of this process then waits `seconds` with its temporary file
// written, before the rename. 0 (the default) turns it off.
void set_write_pause_for_testing(double seconds);

// Removes the temporary files of the writes in progress in this process. Async-signal-
// safe: for a signal handler that is about to end the process (a second Ctrl-C during a
// save), so that the write it cuts short leaves nothing behind.
void remove_temp_files_in_progress() noexcept;

}  // namespace mg::files
