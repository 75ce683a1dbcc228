// replaceFile: readers see the old or the new contents; a write that fails (a full disk, here a
// file size limit) keeps the old file and leaves no temporary behind.
#include "common/files.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <filesystem>

#include <catch2/catch.hpp>

#include "tests/support/matchers.h"

namespace krane {
namespace {

// Names in `dir` other than `keep`.
std::vector<std::string> othersIn(const std::string& dir, const std::string& keep) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename() != keep) names.push_back(entry.path().filename().string());
  }
  return names;
}

class FilesTest {
 protected:
  FilesTest() {
    char pattern[] = "/tmp/krane-files-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    path_ = dir_ + "/state.json";
  }
  ~FilesTest() { std::filesystem::remove_all(dir_); }
  std::string dir_;
  std::string path_;
};

TEST_CASE_METHOD(FilesTest, "replaceFile replaces the contents and leaves nothing else",
                 "[files]") {
  REQUIRE_THAT(replaceFile(path_, "first"), IsOk());
  REQUIRE_THAT(replaceFile(path_, "second, longer"), IsOk());
  CHECK(readFile(path_, "state").value_or("") == "second, longer");
  CHECK(othersIn(dir_, "state.json").empty());
}

TEST_CASE_METHOD(FilesTest, "a replace that cannot be written keeps the old file", "[files]") {
  REQUIRE_THAT(replaceFile(path_, "the old contents"), IsOk());
  // In a child: the file size limit stands for a full disk.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{8, 8};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    const absl::Status st = replaceFile(path_, std::string(4096, 'x'));
    const bool named = std::string(st.message()).find(path_) != std::string::npos;
    ::_exit(absl::IsUnavailable(st) && named ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("the child's replace must fail with UNAVAILABLE naming the file");
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(readFile(path_, "state").value_or("") == "the old contents");
  INFO("no temporary file left behind");
  CHECK(othersIn(dir_, "state.json") == std::vector<std::string>{});
}

TEST_CASE_METHOD(FilesTest, "a replace into a missing directory names the file", "[files]") {
  const std::string missing = dir_ + "/nope/state.json";
  const absl::Status st = replaceFile(missing, "x");
  CHECK(absl::IsUnavailable(st));
  CHECK_THAT(std::string(st.message()), Catch::Contains(missing));
}

}  // namespace
}  // namespace krane
