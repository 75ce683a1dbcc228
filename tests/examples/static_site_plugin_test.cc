// The example plugin libstatic_site.so, loaded through the agent's own loader (the real C ABI,
// in process): configuration errors, apply and re-apply, refused specs naming their field,
// delete, garbage collection that leaves foreign files alone, and status from observe().
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/plugin_loader.h"
#include "common/strings.h"
#include "tests/support/process.h"

namespace krane {
namespace {

using krane::testing::runfile;
using krane::testing::slurp;
using ::testing::HasSubstr;
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

class StaticSitePluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/krane-site-XXXXXX";
    dir_ = ::mkdtemp(pattern);
    root_ = dir_ + "/sites";
  }
  void TearDown() override {
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
    ASSERT_TRUE(loaded.ok()) << loaded.status();
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

TEST_F(StaticSitePluginTest, RefusesABadConfigurationNamingTheKey) {
  auto unknown = load(strCat(R"({"root": ")", root_, R"(", "rooot": "/x"})"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("config.rooot: unknown key (expected: root, max_files)"));
  auto no_root = load("{}");
  ASSERT_FALSE(no_root.ok());
  EXPECT_THAT(std::string(no_root.status().message()),
              HasSubstr("config.root: required, an absolute directory path"));
  auto relative = load(R"({"root": "sites"})");
  EXPECT_THAT(std::string(relative.status().message()), HasSubstr("config.root"));
  auto too_many = load(strCat(R"({"root": ")", root_, R"(", "max_files": 0})"));
  EXPECT_THAT(std::string(too_many.status().message()),
              HasSubstr("config.max_files: must be a whole number between 1 and 10000, got 0"));
  auto not_json = load("root: /x");
  EXPECT_THAT(std::string(not_json.status().message()), HasSubstr("config: must be a JSON object"));
}

TEST_F(StaticSitePluginTest, WritesReplacesAndRemovesASiteAndReportsEachStep) {
  loadDefault();
  EXPECT_THAT(plugin_->resourceTypes(), ::testing::ElementsAre(kType));
  ASSERT_TRUE(plugin_
                  ->apply(site("home", 3,
                               R"({"files": {"index.html": "<h1>v1</h1>", "css/a.css": "h1{}"}})"))
                  .ok());
  EXPECT_EQ(slurp(root_ + "/home/index.html"), "<h1>v1</h1>");
  EXPECT_EQ(slurp(root_ + "/home/css/a.css"), "h1{}");
  auto ready = lastReport("home");
  EXPECT_EQ(ready.phase(), cluster::v1::RESOURCE_PHASE_READY);
  EXPECT_EQ(ready.version(), 3u);
  EXPECT_EQ(ready.region(), "eu-1");
  EXPECT_EQ(ready.plugin(), "static-site");
  EXPECT_THAT(ready.message(), HasSubstr("2 files, 15 bytes"));

  // The same change again (a redelivery) changes nothing; a new version replaces the whole
  // site, so a file it no longer lists is gone.
  ASSERT_TRUE(plugin_->apply(site("home", 3, R"({"files": {"index.html": "<h1>v1</h1>"}})")).ok());
  ASSERT_TRUE(plugin_->apply(site("home", 5, R"({"files": {"index.html": "<h1>v2</h1>"}})")).ok());
  EXPECT_EQ(slurp(root_ + "/home/index.html"), "<h1>v2</h1>");
  EXPECT_FALSE(fs::exists(root_ + "/home/css"));
  EXPECT_TRUE(fs::is_empty(root_ + "/.staging")) << "nothing left behind by the swap";
  EXPECT_EQ(lastReport("home").version(), 5u);

  ASSERT_TRUE(plugin_->remove(removal("home", 6)).ok());
  EXPECT_FALSE(fs::exists(root_ + "/home"));
  EXPECT_EQ(lastReport("home").phase(), cluster::v1::RESOURCE_PHASE_DELETED);
  EXPECT_EQ(lastReport("home").version(), 6u);
  EXPECT_TRUE(plugin_->remove(removal("home", 7)).ok()) << "removing an absent site is OK";
}

TEST_F(StaticSitePluginTest, RefusesSpecsThatCanNeverWorkNamingTheField) {
  loadDefault();
  ASSERT_TRUE(plugin_->apply(site("blog", 1, R"({"files": {"index.html": "kept"}})")).ok());
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
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << spec << " -> " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(message)) << spec;
  }
  auto wrong_type = site("blog", 2, R"({"files": {}})");
  wrong_type.mutable_resource()->mutable_generic()->set_content_type("text/yaml");
  EXPECT_THAT(std::string(plugin_->apply(wrong_type).message()),
              HasSubstr("content_type: \"text/yaml\" is not supported"));
  EXPECT_THAT(std::string(plugin_->apply(site(".hidden", 2, R"({"files": {}})")).message()),
              HasSubstr("may not be empty, contain '/' or start with '.'"));
  // None of them touched the site that was there.
  EXPECT_EQ(slurp(root_ + "/blog/index.html"), "kept");
  EXPECT_FALSE(fs::exists(dir_ + "/escape.html"));
}

TEST_F(StaticSitePluginTest, GarbageCollectionRemovesOnlyItsOwnUnlistedSites) {
  loadDefault();
  for (const char* id : {"keep", "drop-1", "drop-2"}) {
    ASSERT_TRUE(plugin_->apply(site(id, 1, R"({"files": {"index.html": "x"}})")).ok());
  }
  fs::create_directories(root_ + "/not-a-site");
  std::ofstream(root_ + "/not-a-site/data") << "someone else's";

  plugin::v1::SyncEnd end;
  end.set_snapshot_version(9);
  auto* group = end.add_resources();
  group->set_resource_type(kType);
  group->add_ids("keep");
  ASSERT_TRUE(plugin_->syncEnd(end).ok());
  EXPECT_TRUE(fs::exists(root_ + "/keep/index.html"));
  EXPECT_FALSE(fs::exists(root_ + "/drop-1"));
  EXPECT_FALSE(fs::exists(root_ + "/drop-2"));
  EXPECT_EQ(slurp(root_ + "/not-a-site/data"), "someone else's") << "not made by the plugin";
  EXPECT_EQ(lastReport("drop-1").phase(), cluster::v1::RESOURCE_PHASE_DELETED);
  EXPECT_EQ(lastReport("drop-1").version(), 9u);
}

TEST_F(StaticSitePluginTest, ObserveRebuildsStatusFromDiskInANewInstance) {
  loadDefault();
  ASSERT_TRUE(
      plugin_->apply(site("a", 4, R"({"files": {"index.html": "x", "about.html": "y"}})")).ok());
  ASSERT_TRUE(plugin_->apply(site("b", 5, R"({"files": {"index.html": "x"}})")).ok());
  // A new instance (a restarted plugin host) knows nothing in memory.
  plugin_.reset();
  {
    std::lock_guard lock(mutex_);
    reports_.clear();
  }
  loadDefault();
  fs::remove(root_ + "/b/index.html");
  ASSERT_TRUE(plugin_->observe().ok());
  EXPECT_EQ(lastReport("a").phase(), cluster::v1::RESOURCE_PHASE_READY);
  EXPECT_EQ(lastReport("a").version(), 4u);
  EXPECT_EQ(lastReport("a").region(), "eu-1");
  EXPECT_EQ(lastReport("b").phase(), cluster::v1::RESOURCE_PHASE_DEGRADED);
  EXPECT_EQ(lastReport("b").message(), "index.html is missing");
}

}  // namespace
}  // namespace krane
