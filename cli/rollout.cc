#include "cli/rollout.h"

#include <cstdio>
#include <map>

namespace krane::cli {
namespace {

std::string duration(int64_t seconds) {
  if (seconds <= 0) return "none";
  if (seconds % 3600 == 0) return strCat(seconds / 3600, "h");
  if (seconds % 60 == 0) return strCat(seconds / 60, "m");
  return strCat(seconds, "s");
}

std::string waveLine(const v1::SentinelRollout& r, const v1::SentinelRolloutWave& w) {
  std::string line = strCat("wave ", w.number(), "/", r.waves_size(), "  ", w.sentinels(),
                            " sentinels  ", w.status());
  if (w.status() == "running") {
    if (w.started() > 0) strAppend(&line, "  ", w.started(), " started, ", w.ready(), " ready");
  } else if (w.status() != "pending") {
    strAppend(&line, "  ", w.ready(), " ready");
  }
  if (w.failed() > 0) strAppend(&line, ", ", w.failed(), " failed");
  return line;
}

void printRollout(const Globals& g, const v1::SentinelRollout& r) {
  if (g.output != "table") {
    printStructured(g, protoJson(r));
    return;
  }
  if (r.state() == "idle") {
    std::printf("no sentinel rollout yet\n");
    return;
  }
  std::printf("rollout %s: %s, image %s", r.rollout_id().c_str(), r.state().c_str(),
              r.image().c_str());
  if (r.state() == "in_progress") std::printf(", wave %u/%d", r.current_wave(), r.waves_size());
  std::printf("\n  %u sentinels (%u already on the image), %u at once, bake %s%s\n", r.total(),
              r.already_on_image(), r.max_parallel(), duration(r.bake_seconds()).c_str(),
              r.slack_notifications() ? ", slack on" : "");
  for (const auto& w : r.waves()) std::printf("  %s\n", waveLine(r, w).c_str());
  if (r.failed_sentinel_ids_size() > 0) {
    std::string ids;
    for (const auto& id : r.failed_sentinel_ids()) ids += (ids.empty() ? "" : ", ") + id;
    std::printf("  failed: %s\n", ids.c_str());
  }
  if (!r.message().empty()) std::printf("  %s\n", r.message().c_str());
  if (r.state() == "paused") {
    std::printf("  next: kranectl rollout resume (skip the failed wave), cancel, or rollback\n");
  }
}

// Exit code of a rollout as it stands: paused is a failure scripts must see.
int exitOf(const v1::SentinelRollout& r) {
  if (r.state() == "paused") {
    return fail(kFailed, strCat("the rollout to ", r.image(), " is paused: ", r.message()));
  }
  return kOk;
}

// Follows the rollout until it is no longer moving, a progress line per wave change.
int watchRollout(const Globals& g, Api& api) {
  auto context = api.context(/*deadline=*/false);
  auto stream = api.rollouts().WatchSentinelRollout(context.get(), v1::GetSentinelRolloutRequest());
  v1::SentinelRollout r;
  v1::SentinelRollout last;
  std::map<uint32_t, std::string> printed;
  bool first = true;
  while (stream->Read(&r)) {
    last = r;
    if (g.output != "table") {
      printStructured(g, protoJson(r));
      continue;
    }
    if (first) {
      std::printf("rollout %s to %s: %u sentinels in %d waves\n", r.rollout_id().c_str(),
                  r.image().c_str(), r.total(), r.waves_size());
      first = false;
    }
    for (const auto& w : r.waves()) {
      if (w.status() == "pending") continue;
      const std::string line = waveLine(r, w);
      if (printed[w.number()] == line) continue;
      printed[w.number()] = line;
      std::printf("  %s\n", line.c_str());
    }
    std::fflush(stdout);
  }
  grpc::Status s = stream->Finish();
  if (!s.ok()) return rpcFail(g, "rollout status", s);
  if (g.output == "table") {
    std::printf("rollout %s", last.state().c_str());
    if (!last.message().empty()) std::printf(": %s", last.message().c_str());
    std::printf("\n");
  }
  return exitOf(last);
}

int start(const Globals& g, const StartArgs& a) {
  v1::StartSentinelRolloutRequest req;
  req.set_image(a.image);
  if (!a.waves.empty()) {
    std::stringstream in(a.waves);
    for (std::string part; std::getline(in, part, ',');) {
      try {
        size_t used = 0;
        const unsigned long p = std::stoul(part, &used);
        if (used != part.size()) throw std::invalid_argument(part);
        req.add_wave_percentages(static_cast<uint32_t>(p));
      } catch (const std::exception&) {
        return fail(kUsage, strCat("--waves: not a list of percentages: ", a.waves));
      }
    }
  }
  auto bake = parseSeconds(a.bake);
  if (!bake) return fail(kUsage, strCat("--bake: not a duration (90s, 2m, 1h): ", a.bake));
  auto timeout = parseSeconds(a.sentinel_timeout);
  if (!timeout) {
    return fail(kUsage, strCat("--sentinel-timeout: not a duration: ", a.sentinel_timeout));
  }
  req.set_bake_seconds(*bake);
  req.set_sentinel_timeout_seconds(*timeout);
  req.set_slack_webhook_url(a.slack_webhook);
  req.set_max_parallel(a.max_parallel);
  Api api(g);
  v1::SentinelRollout r;
  auto context = api.context();
  grpc::Status s = api.rollouts().StartSentinelRollout(context.get(), req, &r);
  if (!s.ok()) return rpcFail(g, "rollout sentinels", s);
  if (!a.watch) {
    printRollout(g, r);
    return kOk;
  }
  return watchRollout(g, api);
}

int status(const Globals& g, bool watch) {
  Api api(g);
  if (watch) return watchRollout(g, api);
  v1::SentinelRollout r;
  auto context = api.context();
  grpc::Status s = api.rollouts().GetSentinelRollout(context.get(), {}, &r);
  if (!s.ok()) return rpcFail(g, "rollout status", s);
  printRollout(g, r);
  return exitOf(r);
}

int operation(const Globals& g, const std::string& name, bool watch) {
  Api api(g);
  v1::SentinelRollout r;
  auto context = api.context(/*deadline=*/name != "rollback");
  grpc::Status s;
  if (name == "resume") {
    s = api.rollouts().ResumeSentinelRollout(context.get(), {}, &r);
  } else if (name == "cancel") {
    s = api.rollouts().CancelSentinelRollout(context.get(), {}, &r);
  } else {
    if (g.output == "table") {
      std::printf("rolling back the sentinels that reached the new image...\n");
      std::fflush(stdout);
    }
    s = api.rollouts().RollbackSentinelRollout(context.get(), {}, &r);
  }
  if (!s.ok()) return rpcFail(g, strCat("rollout ", name), s);
  if (watch && r.state() == "in_progress") return watchRollout(g, api);
  printRollout(g, r);
  if (name == "rollback" && g.output == "table") {
    std::printf("%u sentinels reverted to their previous image\n", r.reverted());
  }
  return kOk;
}

std::vector<std::string> sentinelRow(const v1::Sentinel& s) {
  return {s.id(),
          s.environment_id(),
          s.region(),
          s.live_deployment_id().empty() ? "-" : s.live_deployment_id(),
          s.image(),
          s.deploy_status(),
          s.health(),
          strCat(s.available_replicas(), "/", s.replicas()),
          s.running_image().empty() ? "-" : s.running_image(),
          ago(s.status_reported_at_ms())};
}

int listSentinels(const Globals& g, const v1::ListSentinelsRequest& filter) {
  Api api(g);
  v1::ListSentinelsRequest req = filter;
  std::vector<v1::Sentinel> all;
  for (;;) {
    v1::ListSentinelsResponse page;
    auto context = api.context();
    grpc::Status s = api.sentinels().ListSentinels(context.get(), req, &page);
    if (!s.ok()) return rpcFail(g, "sentinels list", s);
    all.insert(all.end(), page.sentinels().begin(), page.sentinels().end());
    if (page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
  }
  if (g.output != "table") {
    Json j = Json::array();
    for (const auto& s : all) j.push_back(protoJson(s));
    printStructured(g, j);
    return kOk;
  }
  std::vector<std::vector<std::string>> rows = {{"ID", "ENVIRONMENT", "REGION", "ROUTES TO",
                                                 "IMAGE", "DEPLOY", "HEALTH", "AVAILABLE",
                                                 "RUNNING IMAGE", "REPORTED"}};
  for (const auto& s : all) rows.push_back(sentinelRow(s));
  printTable(rows);
  return kOk;
}

int getSentinel(const Globals& g, const std::string& id) {
  Api api(g);
  v1::GetSentinelRequest req;
  req.set_id(id);
  v1::Sentinel s;
  auto context = api.context();
  grpc::Status st = api.sentinels().GetSentinel(context.get(), req, &s);
  if (!st.ok()) return rpcFail(g, "sentinels get", st);
  printStructured(g.output == "table" ? Globals{.output = "yaml"} : g, protoJson(s));
  return kOk;
}

}  // namespace

std::optional<int64_t> parseSeconds(const std::string& text) {
  if (text.empty()) return std::nullopt;
  int64_t total = 0;
  int64_t number = -1;
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      number = (number < 0 ? 0 : number) * 10 + (c - '0');
      if (number > 1000000000) return std::nullopt;
      continue;
    }
    if (number < 0) return std::nullopt;
    if (c == 'h') {
      total += number * 3600;
    } else if (c == 'm') {
      total += number * 60;
    } else if (c == 's') {
      total += number;
    } else {
      return std::nullopt;
    }
    number = -1;
  }
  if (number >= 0) total += number;  // a bare number (or a trailing one) is seconds
  return total;
}

void addRolloutCommands(CLI::App& app, const Globals& g, int& code, RolloutCommandArgs& args) {
  auto* rollout = app.add_subcommand(
      "rollout", "Move every running sentinel to a new image, in waves (docs/sentinels.md).");
  rollout->require_subcommand(1);

  StartArgs& start_args = args.start;
  auto* sentinels_cmd = rollout->add_subcommand(
      "sentinels", "Start a fleet rollout; a wave with a failing sentinel pauses it.");
  sentinels_cmd->add_option("--image", start_args.image, "the image to roll out")->required();
  sentinels_cmd->add_option("--waves", start_args.waves,
                            "cumulative percentages, e.g. 1,5,25,50,100 (the default)");
  sentinels_cmd->add_option("--bake", start_args.bake,
                            "each wave must stay healthy this long before the next (90s, 2m)");
  sentinels_cmd->add_option("--slack-webhook", start_args.slack_webhook,
                            "post each transition to this Slack incoming webhook (https)");
  sentinels_cmd->add_option("--max-parallel", start_args.max_parallel,
                            "sentinels of a wave deployed at once (default 50)");
  sentinels_cmd->add_option("--sentinel-timeout", start_args.sentinel_timeout,
                            "how long one sentinel may take to converge (default 10m)");
  sentinels_cmd->add_flag("--watch", start_args.watch, "follow it wave by wave");
  sentinels_cmd->callback([&] { code = start(g, start_args); });

  bool& watch = args.watch;
  auto* status_cmd =
      rollout->add_subcommand("status", "The rollout and its waves; exits 6 when it is paused.");
  status_cmd->add_flag("--watch", watch, "follow it until it stops moving, a line per change");
  status_cmd->callback([&] { code = status(g, watch); });
  auto* resume_cmd =
      rollout->add_subcommand("resume", "Go on after a pause (the failed wave is skipped).");
  resume_cmd->add_flag("--watch", watch, "then follow it");
  resume_cmd->callback([&] { code = operation(g, "resume", watch); });
  rollout->add_subcommand("cancel", "Stop the rollout; sentinels keep the image they run.")
      ->callback([&] { code = operation(g, "cancel", false); });
  rollout
      ->add_subcommand("rollback",
                       "Put every sentinel that reached the new image back on its previous "
                       "image (from paused or cancelled); waits until they converged.")
      ->callback([&] { code = operation(g, "rollback", false); });

  auto* sentinels = app.add_subcommand("sentinels", "Sentinels and their convergence.");
  sentinels->require_subcommand(1);
  v1::ListSentinelsRequest& filter = args.filter;
  std::string& env = args.env;
  std::string& region = args.region;
  std::string& deploy_status = args.deploy_status;
  std::string& id = args.id;
  auto* list = sentinels->add_subcommand("list", "In id order.");
  list->add_option("--env", env, "of this environment");
  list->add_option("--region", region, "in this region");
  list->add_option("--status", deploy_status, "idle, progressing, ready or failed");
  list->callback([&] {
    filter.set_environment_id(env);
    filter.set_region(region);
    filter.set_deploy_status(deploy_status);
    code = listSentinels(g, filter);
  });
  auto* get = sentinels->add_subcommand("get", "One sentinel, desired and observed.");
  get->add_option("id", id, "sentinel id")->required();
  get->callback([&] { code = getSentinel(g, id); });
}

}  // namespace krane::cli
