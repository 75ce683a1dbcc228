// Reading a whole file, with an error that names what the file is for; writing files and
// directories that only their owner may read (an agent's state: credentials, sockets);
// replacing a file atomically for readers in other processes.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

// Replaces the contents of `path` with `contents`, mode 0600 (also when the file existed with a
// wider mode). UNAVAILABLE naming the file when it cannot.
inline absl::Status writePrivateFile(const std::string& path, std::string_view contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, S_IRUSR | S_IWUSR);
  if (fd < 0)
    return absl::UnavailableError(strCat("cannot write ", path, ": ", std::strerror(errno)));
  bool ok = ::fchmod(fd, S_IRUSR | S_IWUSR) == 0;
  size_t done = 0;
  while (ok && done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  const int saved = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok) {
    return absl::UnavailableError(strCat("cannot write ", path, ": ", std::strerror(saved)));
  }
  return absl::OkStatus();
}

// Replaces `path` with `contents` in one step (a temporary file next to it, then rename), so a
// reader sees either the old or the new contents, never a part. UNAVAILABLE naming the file.
inline absl::Status replaceFile(const std::string& path, std::string_view contents) {
  const std::string tmp = strCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << contents;
    out.flush();
    if (!out) return absl::UnavailableError(strCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(strCat("cannot replace ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace krane
