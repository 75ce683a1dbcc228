// Reading a whole file, with an error that names what the file is for; writing files and
// directories that only their owner may read (an agent's state: credentials, sockets);
// replacing a file atomically for readers in other processes.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/strings.h"

namespace krane {

// NOT_FOUND "cannot read <what> <path>" when the file cannot be opened.
inline absl::StatusOr<std::string> readFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(strCat("cannot read ", what, " ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Creates `dir` (and missing parents, with the default mode) and makes `dir` itself 0700, also
// when it existed with a wider mode. UNAVAILABLE naming the directory when it cannot.
inline absl::Status makePrivateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(strCat("cannot create ", dir, ": ", ec.message()));
  if (::chmod(dir.c_str(), S_IRWXU) != 0) {
    return absl::UnavailableError(strCat("cannot make ", dir, " private: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

namespace files_internal {

// Writes all of `contents` to `fd`; false with errno set when it cannot.
inline bool writeAll(int fd, std::string_view contents) {
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace files_internal

// Replaces the contents of `path` with `contents`, mode 0600 (also when the file existed with a
// wider mode). UNAVAILABLE naming the file when it cannot.
inline absl::Status writePrivateFile(const std::string& path, std::string_view contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, S_IRUSR | S_IWUSR);
  if (fd < 0)
    return absl::UnavailableError(strCat("cannot write ", path, ": ", std::strerror(errno)));
  bool ok = ::fchmod(fd, S_IRUSR | S_IWUSR) == 0 && files_internal::writeAll(fd, contents);
  const int saved = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok) {
    return absl::UnavailableError(strCat("cannot write ", path, ": ", std::strerror(saved)));
  }
  return absl::OkStatus();
}

// Replaces `path` with `contents` in one step (a temporary file next to it, then rename), so a
// reader sees either the old or the new contents, never a part. The contents and the rename are
// on disk when it returns (fsync of the file, then of its directory), so a power loss cannot leave
// the new name with missing contents. On failure the old file stays and the temporary one is
// removed. UNAVAILABLE naming the file.
inline absl::Status replaceFile(const std::string& path, std::string_view contents) {
  static std::atomic<uint64_t> serial{0};  // two threads replacing one path use two temporaries
  const std::string tmp = strCat(path, ".tmp.", ::getpid(), ".", serial.fetch_add(1));
  const auto failed = [&](const char* what) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(strCat("cannot ", what, " ", path, ": ", std::strerror(saved)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return failed("write");
  bool ok = files_internal::writeAll(fd, contents) && ::fsync(fd) == 0;
  const int saved = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok) {
    errno = saved;
    return failed("write");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return failed("replace");
  // The rename itself lives in the directory.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace krane
