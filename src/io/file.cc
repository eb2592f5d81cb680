#include "attn/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace attn {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, const std::string& what, int error) {
  throw IOError(path + ": " + what + ": " + std::strerror(error));
}

// False, with errno set, at the first write that fails.
bool write_all(int fd, std::initializer_list<std::string_view> parts) {
  for (const std::string_view part : parts) {
    const char* at = part.data();
    size_t left = part.size();
    while (left > 0) {
      // Linux writes at most about 2 GiB per call; larger counts are split anyway.
      const ssize_t n = ::write(fd, at, std::min<size_t>(left, size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0) errno = EIO;  // no progress and no reason: never loop forever
        return false;
      }
      at += n;
      left -= static_cast<size_t>(n);
    }
  }
  return true;
}

// What `path` names once symbolic links are followed, also when the last one
// dangles (writing through it creates its target, as open() would).
fs::path follow_links(const std::string& path) {
  fs::path p = path;
  std::error_code error;
  // 40 hops: the kernel's own limit before it gives up with ELOOP.
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, error)); ++hops) {
    const fs::path link = fs::read_symlink(p, error);
    if (error) break;
    p = link.is_absolute() ? link : p.parent_path() / link;
  }
  return p;
}

void write_in_place(const std::string& path, std::initializer_list<std::string_view> parts) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open for writing", errno);
  if (!write_all(fd, parts)) {
    const int error = errno;
    ::close(fd);
    fail(path, "write failed", error);
  }
  if (::close(fd) != 0) fail(path, "write failed", errno);
}

}  // namespace

void write_file(const std::string& path, std::initializer_list<std::string_view> parts) {
  struct stat old;
  const bool exists = ::stat(path.c_str(), &old) == 0;
  if (!exists && errno != ENOENT) fail(path, "cannot open for writing", errno);
  if (exists && !S_ISREG(old.st_mode)) return write_in_place(path, parts);

  // The temporary file must be on the target's file system for rename() to
  // be atomic: beside the target itself, not beside a link to it.
  const fs::path target = follow_links(path);
  static std::atomic<uint64_t> counter{0};
  fs::path temporary;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    temporary = target;
    temporary.replace_filename(".");  // ".out.npy.tmp-<pid>-<n>": hidden, and unique
    temporary += target.filename();
    temporary += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    // Mode 0666 and no chmod for a new file: the umask decides, as for any new file.
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100)) {
      const std::string folder = target.has_parent_path() ? target.parent_path().string() : ".";
      fail(path, "cannot write: cannot open a new file in '" + folder + "'", errno);
    }
  }
  const auto abandon = [&](const char* what) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(temporary.c_str());
    fail(path, what, error);
  };
  if (exists && ::fchmod(fd, old.st_mode & 07777) != 0) abandon("cannot keep the file's mode");
  if (!write_all(fd, parts) || ::fsync(fd) != 0) abandon("write failed");
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) abandon("write failed");
  if (::rename(temporary.c_str(), target.c_str()) != 0) abandon("cannot replace the file");
}

}  // namespace attn
