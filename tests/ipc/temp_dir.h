// A short, unique state directory per test under /tmp (removed afterwards unless KRANE_TEST_KEEP
// is set), and raw access to a store file for tests that damage it on purpose.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace krane::ipc::testing {

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/kcs-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    if (std::getenv("KRANE_TEST_KEEP") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The whole file mapped shared and writable, whatever its content.
class RawFile {
 public:
  explicit RawFile(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error("cannot open " + path);
    struct stat st;
    ::fstat(fd_, &st);
    size_ = static_cast<size_t>(st.st_size);
    base_ = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (base_ == MAP_FAILED) throw std::runtime_error("cannot map " + path);
  }
  ~RawFile() {
    ::munmap(base_, size_);
    ::close(fd_);
  }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;

  template <typename T>
  T* at(size_t offset) {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + offset);
  }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  size_t size_ = 0;
  void* base_ = nullptr;
};

}  // namespace krane::ipc::testing
