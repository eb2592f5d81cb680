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
  throw IOError(path, what, error);
}

// False, with errno set, at the first write that fails.
bool write_all(int fd, const std::vector<std::string_view>& parts) {
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

void write_in_place(const std::string& path, const std::vector<std::string_view>& parts) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open for writing", errno);
  if (!write_all(fd, parts)) {
    const int error = errno;
    ::close(fd);
    fail(path, "write failed", error);
  }
  if (::close(fd) != 0) fail(path, "write failed", errno);
}

// A file of the set on its way: where it goes, and the temporary file
// holding its bytes until the rename (none for one written in place).
struct Staged {
  std::string path;
  fs::path target, temporary;
  bool in_place = false;
};

// Removes the temporary files not yet renamed unless dismissed.
struct Cleanup {
  std::vector<Staged>& staged;
  bool dismissed = false;
  ~Cleanup() {
    if (dismissed) return;
    for (const Staged& s : staged)
      if (!s.temporary.empty()) ::unlink(s.temporary.c_str());
  }
};

// How `path` is written, checked before anything is: in place or replaced,
// and that the caller may write it.
Staged plan(const std::string& path) {
  Staged s{path, {}, {}, false};
  struct stat old;
  const bool exists = ::stat(path.c_str(), &old) == 0;
  if (!exists && errno != ENOENT) fail(path, "cannot open for writing", errno);
  s.in_place = exists && !S_ISREG(old.st_mode);
  // Replacing is a rename, which the folder's permission allows: the file's
  // own (mode 444, say) must be asked for separately, as cp does.
  if (exists && ::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0)
    fail(path, "cannot open for writing", errno);
  // The temporary file must be on the target's file system for rename() to
  // be atomic: beside the target itself, not beside a link to it.
  if (!s.in_place) s.target = follow_links(path);
  return s;
}

// Writes the bytes of s to a new temporary file beside its target.
void stage(Staged& s, const std::vector<std::string_view>& parts) {
  static std::atomic<uint64_t> counter{0};
  struct stat old;
  const bool exists = ::stat(s.target.c_str(), &old) == 0;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    fs::path temporary = s.target;
    temporary.replace_filename(".");  // ".out.npy.tmp-<pid>-<n>": hidden, and unique
    temporary += s.target.filename();
    temporary += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    // Mode 0666 and no chmod for a new file: the umask decides, as for any new file.
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) s.temporary = temporary;
    if (fd < 0 && (errno != EEXIST || attempt == 100)) {
      const std::string folder = s.target.has_parent_path() ? s.target.parent_path().string() : ".";
      fail(s.path, "cannot write: cannot open a new file in '" + folder + "'", errno);
    }
  }
  const auto abandon = [&](const char* what) {
    const int error = errno;
    ::close(fd);
    fail(s.path, what, error);
  };
  if (exists && ::fchmod(fd, old.st_mode & 07777) != 0) abandon("cannot keep the file's mode");
  if (!write_all(fd, parts) || ::fsync(fd) != 0) abandon("write failed");
  if (::close(fd) != 0) fail(s.path, "write failed", errno);
}

}  // namespace

IOError::IOError(const std::string& path, const std::string& what, int error_number)
    : Error(path + ": " + what + ": " + std::strerror(error_number)),
      error_number_(error_number),
      path_(path),
      what_failed_(what) {}

void FileSet::add(const std::string& path, std::initializer_list<std::string_view> parts) {
  files_.push_back({path, nullptr, parts});
}

void FileSet::add(const std::string& path, std::string bytes) {
  auto owned = std::make_unique<std::string>(std::move(bytes));
  const std::string_view view = *owned;
  files_.push_back({path, std::move(owned), {view}});
}

void FileSet::write(const std::function<void()>& before_replacing) {
  std::vector<Staged> staged;
  staged.reserve(files_.size());
  for (const File& f : files_) {
    staged.push_back(plan(f.path));
    for (size_t i = 0; i + 1 < staged.size(); ++i)
      if (!staged.back().in_place && staged[i].target == staged.back().target)
        throw IOError(f.path + ": also given as '" + staged[i].path + "': each output needs a file of its own");
  }
  Cleanup cleanup{staged};
  for (size_t i = 0; i < files_.size(); ++i)
    if (!staged[i].in_place) stage(staged[i], files_[i].parts);
  for (size_t i = 0; i < files_.size(); ++i)
    if (staged[i].in_place) write_in_place(staged[i].path, files_[i].parts);
  if (before_replacing) before_replacing();
  for (Staged& s : staged) {
    if (s.in_place) continue;
    if (::rename(s.temporary.c_str(), s.target.c_str()) != 0) fail(s.path, "cannot replace the file", errno);
    s.temporary.clear();
  }
  cleanup.dismissed = true;
}

void write_file(const std::string& path, std::initializer_list<std::string_view> parts) {
  FileSet files;
  files.add(path, parts);
  files.write();
}

}  // namespace attn
