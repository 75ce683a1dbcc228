// main() for every Krane test binary: Catch2, fitted to `bazel test`.
//
// - The console reporter writes to the test log as usual; when Bazel asks for a JUnit file
//   (XML_OUTPUT_FILE), Catch2's own JUnit reporter writes it as well, through a listener.
// - `bazel test --test_filter=SPEC` (TESTBRIDGE_TEST_ONLY) becomes Catch2's test spec: a test
//   case name (with `*` wildcards) or tags such as `[slow]` or `~[slow]`.
// - A run in which nothing matches the filter passes: the filter picked test cases elsewhere.
#define CATCH_CONFIG_RUNNER
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace {

// Forwards every event to a JUnit reporter writing $XML_OUTPUT_FILE; inert without it.
class JunitFileListener : public Catch::IStreamingReporter {
 public:
  explicit JunitFileListener(const Catch::ReporterConfig& config) {
    const char* path = std::getenv("XML_OUTPUT_FILE");
    if (path == nullptr || *path == '\0') return;
    out_.open(path, std::ios::out | std::ios::trunc);
    if (!out_) return;
    junit_ =
        std::make_unique<Catch::JunitReporter>(Catch::ReporterConfig(config.fullConfig(), out_));
  }

  static std::string getDescription() { return "writes JUnit XML to $XML_OUTPUT_FILE"; }

  Catch::ReporterPreferences getPreferences() const override { return {}; }

  void noMatchingTestCases(const std::string& spec) override {
    if (junit_) junit_->noMatchingTestCases(spec);
  }
  void testRunStarting(const Catch::TestRunInfo& info) override {
    if (junit_) junit_->testRunStarting(info);
  }
  void testGroupStarting(const Catch::GroupInfo& info) override {
    if (junit_) junit_->testGroupStarting(info);
  }
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    if (junit_) junit_->testCaseStarting(info);
  }
  void sectionStarting(const Catch::SectionInfo& info) override {
    if (junit_) junit_->sectionStarting(info);
  }
  void assertionStarting(const Catch::AssertionInfo& info) override {
    if (junit_) junit_->assertionStarting(info);
  }
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    return junit_ ? junit_->assertionEnded(stats) : false;
  }
  void sectionEnded(const Catch::SectionStats& stats) override {
    if (junit_) junit_->sectionEnded(stats);
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    if (junit_) junit_->testCaseEnded(stats);
  }
  void testGroupEnded(const Catch::TestGroupStats& stats) override {
    if (junit_) junit_->testGroupEnded(stats);
  }
  void testRunEnded(const Catch::TestRunStats& stats) override {
    if (!junit_) return;
    junit_->testRunEnded(stats);
    out_.flush();
  }
  void skipTest(const Catch::TestCaseInfo& info) override {
    if (junit_) junit_->skipTest(info);
  }

 private:
  std::ofstream out_;
  std::unique_ptr<Catch::JunitReporter> junit_;
};

CATCH_REGISTER_LISTENER(JunitFileListener)

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  // Bazel's --test_filter, unless the command line names test cases itself.
  std::string filter;
  if (const char* only = std::getenv("TESTBRIDGE_TEST_ONLY"); only != nullptr && *only != '\0') {
    filter = only;
    bool has_spec = false;
    for (int i = 1; i < argc; ++i) {
      if (argv[i][0] != '-') has_spec = true;
    }
    if (!has_spec) args.push_back(filter.data());
  }
  Catch::Session session;
  // Durations of slow test cases in the log help find what makes a target slow.
  session.configData().showDurations = Catch::ShowDurations::Always;
  const int parsed = session.applyCommandLine(static_cast<int>(args.size()), args.data());
  if (parsed != 0) return parsed;
  return session.run();
}
