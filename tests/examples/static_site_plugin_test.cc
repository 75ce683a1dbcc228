// The example plugin libstatic_site.so, loaded through the agent's own loader (the real C ABI,
// in process): configuration errors, apply and re-apply, refused specs naming their field,
// delete, garbage collection that leaves foreign files alone, and status from observe().
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <catch2/catch.hpp>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "tests/support/matchers.h"
#include "tests/support/process.h"

namespace krane {
namespace {

using krane::testing::runfile;
using krane::testing::slurp;
namespace fs = std::filesystem;

constexpr char kType[] = "example.krane.dev/static-site";

cluster::v1::Change site(const std::string& id, uint64_t version, const std::string& spec) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_APPLY);
  c.set_version(version);
  auto* r = c.mutable_resource();
  r->set_type(kType);
  r->set_id(id);
  r->set_region("eu-1");
  r->set_version(version);
  r->mutable_generic()->set_type(kType);
  r->mutable_generic()->set_spec(spec);
  r->mutable_generic()->set_content_type("application/json");
  return c;
}

cluster::v1::Change removal(const std::string& id, uint64_t version) {
  cluster::v1::Change c;
  c.set_op(cluster::v1::CHANGE_OP_DELETE);
  c.set_version(version);
  c.mutable_resource()->set_type(kType);
  c.mutable_resource()->set_id(id);
  c.mutable_resource()->set_region("eu-1");
  return c;
}

class StaticSitePluginTest {
 protected:
  StaticSitePluginTest() {
    char pattern[] = "/tmp/krane-site-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    root_ = dir_ + "/sites";
  }
  ~StaticSitePluginTest() {
    plugin_.reset();
    fs::remove_all(dir_);
  }

  absl::StatusOr<std::unique_ptr<agent::LoadedPlugin>> load(const std::string& config) {
    agent::HostCallbacks callbacks;
    callbacks.report_status = [this](const plugin::v1::StatusReport& r) {
      std::lock_guard lock(mutex_);
      if (r.has_resource()) reports_.push_back(r.resource());
    };
    return agent::loadPlugin(runfile("examples/plugins/static_site/libstatic_site.so"), config,
                             callbacks);
  }

  void loadDefault() {
    auto loaded = load(strCat(R"({"root": ")", root_, R"(", "max_files": 3})"));
    REQUIRE_THAT(loaded, IsOk());
    plugin_ = *std::move(loaded);
  }

  cluster::v1::ReportResourceStatusRequest lastReport(const std::string& id) {
    std::lock_guard lock(mutex_);
    for (auto it = reports_.rbegin(); it != reports_.rend(); ++it) {
      if (it->id() == id) return *it;
    }
    return {};
  }

  std::string dir_;
  std::string root_;
  std::unique_ptr<agent::LoadedPlugin> plugin_;
  std::mutex mutex_;
  std::vector<cluster::v1::ReportResourceStatusRequest> reports_;
};

TEST_CASE_METHOD(StaticSitePluginTest, "refuses a bad configuration naming the key",
                 "[static-site-plugin]") {
  auto unknown = load(strCat(R"({"root": ")", root_, R"(", "rooot": "/x"})"));
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(std::string(unknown.status().message()),
             Catch::Contains("config.rooot: unknown key (expected: root, max_files)"));
  auto no_root = load("{}");
  REQUIRE_FALSE(no_root.ok());
  CHECK_THAT(std::string(no_root.status().message()),
             Catch::Contains("config.root: required, an absolute directory path"));
  auto relative = load(R"({"root": "sites"})");
  CHECK_THAT(std::string(relative.status().message()), Catch::Contains("config.root"));
  auto too_many = load(strCat(R"({"root": ")", root_, R"(", "max_files": 0})"));
  CHECK_THAT(
      std::string(too_many.status().message()),
      Catch::Contains("config.max_files: must be a whole number between 1 and 10000, got 0"));
  auto not_json = load("root: /x");
  CHECK_THAT(std::string(not_json.status().message()),
             Catch::Contains("config: must be a JSON object"));
}

TEST_CASE_METHOD(StaticSitePluginTest, "writes replaces and removes a site and reports each step",
                 "[static-site-plugin]") {
  loadDefault();
  CHECK(plugin_->resourceTypes() == std::vector<std::string>{kType});
  REQUIRE_THAT(plugin_->apply(site(
                   "home", 3, R"({"files": {"index.html": "<h1>v1</h1>", "css/a.css": "h1{}"}})")),
               IsOk());
  CHECK(slurp(root_ + "/home/index.html") == "<h1>v1</h1>");
  CHECK(slurp(root_ + "/home/css/a.css") == "h1{}");
  auto ready = lastReport("home");
  CHECK(ready.phase() == cluster::v1::RESOURCE_PHASE_READY);
  CHECK(ready.version() == 3u);
  CHECK(ready.region() == "eu-1");
  CHECK(ready.plugin() == "static-site");
  CHECK_THAT(ready.message(), Catch::Contains("2 files, 15 bytes"));

  // The same change again (a redelivery) changes nothing; a new version replaces the whole
  // site, so a file it no longer lists is gone.
  REQUIRE_THAT(plugin_->apply(site("home", 3, R"({"files": {"index.html": "<h1>v1</h1>"}})")),
               IsOk());
  REQUIRE_THAT(plugin_->apply(site("home", 5, R"({"files": {"index.html": "<h1>v2</h1>"}})")),
               IsOk());
  CHECK(slurp(root_ + "/home/index.html") == "<h1>v2</h1>");
  CHECK_FALSE(fs::exists(root_ + "/home/css"));
  INFO("nothing left behind by the swap");
  CHECK(fs::is_empty(root_ + "/.staging"));
  CHECK(lastReport("home").version() == 5u);

  REQUIRE_THAT(plugin_->remove(removal("home", 6)), IsOk());
  CHECK_FALSE(fs::exists(root_ + "/home"));
  CHECK(lastReport("home").phase() == cluster::v1::RESOURCE_PHASE_DELETED);
  CHECK(lastReport("home").version() == 6u);
  INFO("removing an absent site is OK");
  CHECK_THAT(plugin_->remove(removal("home", 7)), IsOk());
}

TEST_CASE_METHOD(StaticSitePluginTest, "refuses specs that can never work naming the field",
                 "[static-site-plugin]") {
  loadDefault();
  REQUIRE_THAT(plugin_->apply(site("blog", 1, R"({"files": {"index.html": "kept"}})")), IsOk());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "spec: not valid JSON"},
      {"[1, 2]", "spec: must be a JSON object"},
      {R"({"filez": {}})", "spec.filez: unknown key (expected: files)"},
      {R"({})", "spec.files: required"},
      {R"({"files": {"index.html": 42}})", "spec.files[\"index.html\"]: must be a string, got 42"},
      {R"({"files": {"../escape.html": "x"}})",
       "spec.files[\"../escape.html\"]: empty, '.' and '..' path components are not allowed"},
      {R"({"files": {"/etc/passwd": "x"}})",
       "spec.files[\"/etc/passwd\"]: must be a relative path"},
      {R"({"files": {".krane-static-site.json": "x"}})", "the name is reserved by the plugin"},
      {R"({"files": {"a": "", "b": "", "c": "", "d": ""}})", "spec.files: at most 3 files, got 4"},
  };
  for (const auto& [spec, message] : cases) {
    const absl::Status st = plugin_->apply(site("blog", 2, spec));
    INFO(spec << " -> " << st);
    CHECK(absl::IsInvalidArgument(st));
    INFO(spec);
    CHECK_THAT(std::string(st.message()), Catch::Contains(message));
  }
  auto wrong_type = site("blog", 2, R"({"files": {}})");
  wrong_type.mutable_resource()->mutable_generic()->set_content_type("text/yaml");
  CHECK_THAT(std::string(plugin_->apply(wrong_type).message()),
             Catch::Contains("content_type: \"text/yaml\" is not supported"));
  CHECK_THAT(std::string(plugin_->apply(site(".hidden", 2, R"({"files": {}})")).message()),
             Catch::Contains("may not be empty, contain '/' or start with '.'"));
  // None of them touched the site that was there.
  CHECK(slurp(root_ + "/blog/index.html") == "kept");
  CHECK_FALSE(fs::exists(dir_ + "/escape.html"));
}

TEST_CASE_METHOD(StaticSitePluginTest, "garbage collection removes only its own unlisted sites",
                 "[static-site-plugin]") {
  loadDefault();
  for (const char* id : {"keep", "drop-1", "drop-2"}) {
    REQUIRE_THAT(plugin_->apply(site(id, 1, R"({"files": {"index.html": "x"}})")), IsOk());
  }
  fs::create_directories(root_ + "/not-a-site");
  std::ofstream(root_ + "/not-a-site/data") << "someone else's";

  plugin::v1::SyncEnd end;
  end.set_snapshot_version(9);
  auto* group = end.add_resources();
  group->set_resource_type(kType);
  group->add_ids("keep");
  REQUIRE_THAT(plugin_->syncEnd(end), IsOk());
  CHECK(fs::exists(root_ + "/keep/index.html"));
  CHECK_FALSE(fs::exists(root_ + "/drop-1"));
  CHECK_FALSE(fs::exists(root_ + "/drop-2"));
  INFO("not made by the plugin");
  CHECK(slurp(root_ + "/not-a-site/data") == "someone else's");
  CHECK(lastReport("drop-1").phase() == cluster::v1::RESOURCE_PHASE_DELETED);
  CHECK(lastReport("drop-1").version() == 9u);
}

TEST_CASE_METHOD(StaticSitePluginTest, "observe rebuilds status from disk in a new instance",
                 "[static-site-plugin]") {
  loadDefault();
  REQUIRE_THAT(plugin_->apply(site("a", 4, R"({"files": {"index.html": "x", "about.html": "y"}})")),
               IsOk());
  REQUIRE_THAT(plugin_->apply(site("b", 5, R"({"files": {"index.html": "x"}})")), IsOk());
  // A new instance (a restarted plugin host) knows nothing in memory.
  plugin_.reset();
  {
    std::lock_guard lock(mutex_);
    reports_.clear();
  }
  loadDefault();
  fs::remove(root_ + "/b/index.html");
  REQUIRE_THAT(plugin_->observe(), IsOk());
  CHECK(lastReport("a").phase() == cluster::v1::RESOURCE_PHASE_READY);
  CHECK(lastReport("a").version() == 4u);
  CHECK(lastReport("a").region() == "eu-1");
  CHECK(lastReport("b").phase() == cluster::v1::RESOURCE_PHASE_DEGRADED);
  CHECK(lastReport("b").message() == "index.html is missing");
}

}  // namespace
}  // namespace krane
