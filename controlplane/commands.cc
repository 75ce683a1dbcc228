#include "controlplane/commands.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "common/clock.h"
#include "common/strings.h"
#include "controlplane/api/auth.h"
#include "controlplane/config.h"
#include "controlplane/db/pool.h"
#include "controlplane/feed/resource_table.h"
#include "controlplane/ingest/ingestor.h"
#include "controlplane/server.h"
#include "spdlog/spdlog.h"

namespace krane::ctrl {
namespace {

int fail(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "krane-ctrl %s: error: %s\n", command.c_str(),
               std::string(toStd(status.message())).c_str());
  return 1;
}

absl::StatusOr<std::shared_ptr<db::Pool>> openDatabase(const std::string& flag) {
  std::string text = flag;
  if (text.empty()) {
    if (const char* env = std::getenv("KRANE_DSN")) text = env;
  }
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "no database given: pass --dsn mysql://user:password@host:3306/krane or set KRANE_DSN");
  }
  auto dsn = db::parseDsn(text);
  if (!dsn.ok()) return dsn.status();
  return db::Pool::create(*dsn, {.max_connections = 2});
}

struct ServeFlags {
  std::string config;
  std::string dsn;
  std::string listen;
  std::string http_listen;
  std::string log_level = "info";
};

int serve(const ServeFlags& flags) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  absl::StatusOr<CtrlConfig> config =
      flags.config.empty() ? CtrlConfig{} : loadCtrlConfig(flags.config);
  if (!config.ok()) return fail("serve", config.status());
  if (!flags.dsn.empty()) config->database.dsn = flags.dsn;
  if (!flags.listen.empty()) config->listen = flags.listen;
  if (!flags.http_listen.empty()) config->http_listen = flags.http_listen;
  if (auto st = finishCtrlConfig(*config); !st.ok()) return fail("serve", st);

  // Signals are taken by this thread alone, with sigwait, once everything runs.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Server server(*config);
  if (auto st = server.start(); !st.ok()) return fail("serve", st);
  const std::string watch =
      server.watchPort() != 0 ? strCat(", watch 127.0.0.1:", server.watchPort()) : "";
  std::printf("krane-ctrl serving: grpc 127.0.0.1:%d, http 127.0.0.1:%d%s\n", server.grpcPort(),
              server.httpPort(), watch.c_str());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("ctrl: {} received, stopping", signal == SIGINT ? "SIGINT" : "SIGTERM");
  server.stop();
  return 0;
}

}  // namespace

void addServeCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Run the control plane: APIs, change feed, status ingestion, metrics.");
  cmd->add_option("--config", flags->config, "YAML configuration file (see docs/configuration.md)");
  cmd->add_option("--dsn", flags->dsn, "Database, overrides database.dsn (default: $KRANE_DSN)");
  cmd->add_option("--listen", flags->listen,
                  "gRPC address host:port, overrides listen (port 0: any free port)");
  cmd->add_option("--http-listen", flags->http_listen,
                  "HTTP address for /metrics, /healthz, /readyz");
  cmd->add_option("--log-level", flags->log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  cmd->callback([flags, &exit_code] { exit_code = serve(*flags); });
}

void addRegionCommands(CLI::App& app, int& exit_code) {
  CLI::App* region =
      app.add_subcommand("region", "Register and list regions (each runs one agent deployment).");
  region->require_subcommand(1);
  auto dsn = std::make_shared<std::string>();

  auto id = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  CLI::App* add = region->add_subcommand("add", "Register a region; safe to repeat.");
  add->add_option("--dsn", *dsn, "Database (default: $KRANE_DSN)");
  add->add_option("id", *id, "Region id, e.g. eu-west-1")->required();
  add->add_option("--name", *name, "Display name (default: the id)");
  add->callback([dsn, id, name, &exit_code] {
    if (auto st = feed::checkId("id", *id); !st.ok()) {
      exit_code = fail("region add", st);
      return;
    }
    auto pool = openDatabase(*dsn);
    if (!pool.ok()) {
      exit_code = fail("region add", pool.status());
      return;
    }
    auto st = (*pool)->transact("region-add", [&](db::Connection& conn) {
      return conn
          .exec(
              "INSERT INTO regions (id, display_name, created_at) VALUES (?, ?, ?)"
              " ON DUPLICATE KEY UPDATE display_name = VALUES(display_name)",
              {*id, name->empty() ? *id : *name, unixMillis()})
          .status();
    });
    if (!st.ok()) {
      exit_code = fail("region add", st);
      return;
    }
    std::printf("region %s registered\n", id->c_str());
  });

  CLI::App* list = region->add_subcommand("list", "List the regions.");
  list->add_option("--dsn", *dsn, "Database (default: $KRANE_DSN)");
  list->callback([dsn, &exit_code] {
    auto pool = openDatabase(*dsn);
    if (!pool.ok()) {
      exit_code = fail("region list", pool.status());
      return;
    }
    auto conn = (*pool)->acquire();
    if (!conn.ok()) {
      exit_code = fail("region list", conn.status());
      return;
    }
    auto rows = (*conn)->query(
        "SELECT r.id, r.display_name, COALESCE(v.version, 0) FROM regions r"
        " LEFT JOIN region_versions v ON v.region_id = r.id ORDER BY r.id",
        {});
    if (!rows.ok()) {
      exit_code = fail("region list", rows.status());
      return;
    }
    std::printf("%-24s %-32s %s\n", "REGION", "NAME", "VERSION");
    for (const auto& row : rows->rows) {
      std::printf("%-24s %-32s %llu\n", row.str(0).c_str(), row.str(1).c_str(),
                  static_cast<unsigned long long>(row.u64(2)));
    }
  });
}

void addTokenCommands(CLI::App& app, int& exit_code) {
  CLI::App* token = app.add_subcommand("token", "Create, list and revoke agent tokens.");
  token->require_subcommand(1);
  auto dsn = std::make_shared<std::string>();

  auto region = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  CLI::App* create = token->add_subcommand(
      "create",
      "Create a token for the agents of one region; it is printed once and stored hashed.");
  create->add_option("--dsn", *dsn, "Database (default: $KRANE_DSN)");
  create->add_option("--region", *region, "Region the token may watch and report for")->required();
  create->add_option("--name", *name, "What the token is for (shown by `token list`)");
  create->callback([dsn, region, name, &exit_code] {
    auto pool = openDatabase(*dsn);
    if (!pool.ok()) {
      exit_code = fail("token create", pool.status());
      return;
    }
    api::AgentTokens tokens(*pool);
    auto created = tokens.create(*region, *name);
    if (!created.ok()) {
      exit_code = fail("token create", created.status());
      return;
    }
    std::fprintf(stderr, "created %s for region %s; store it now, it is not shown again:\n",
                 created->token.id.c_str(), region->c_str());
    std::printf("%s\n", created->secret.c_str());
  });

  auto list_region = std::make_shared<std::string>();
  CLI::App* list = token->add_subcommand("list", "List agent tokens (never their secrets).");
  list->add_option("--dsn", *dsn, "Database (default: $KRANE_DSN)");
  list->add_option("--region", *list_region, "Only this region");
  list->callback([dsn, list_region, &exit_code] {
    auto pool = openDatabase(*dsn);
    if (!pool.ok()) {
      exit_code = fail("token list", pool.status());
      return;
    }
    auto all = api::AgentTokens(*pool).list(*list_region);
    if (!all.ok()) {
      exit_code = fail("token list", all.status());
      return;
    }
    std::printf("%-26s %-20s %-10s %s\n", "ID", "REGION", "STATE", "NAME");
    for (const auto& t : *all) {
      std::printf("%-26s %-20s %-10s %s\n", t.id.c_str(), t.region.c_str(),
                  t.revoked_at_ms ? "revoked" : "active", t.name.c_str());
    }
  });

  auto revoke_id = std::make_shared<std::string>();
  CLI::App* revoke =
      token->add_subcommand("revoke", "Revoke a token (takes effect within the token cache time).");
  revoke->add_option("--dsn", *dsn, "Database (default: $KRANE_DSN)");
  revoke->add_option("id", *revoke_id, "Token id from `token list`")->required();
  revoke->callback([dsn, revoke_id, &exit_code] {
    auto pool = openDatabase(*dsn);
    if (!pool.ok()) {
      exit_code = fail("token revoke", pool.status());
      return;
    }
    if (auto st = api::AgentTokens(*pool).revoke(*revoke_id); !st.ok()) {
      exit_code = fail("token revoke", st);
      return;
    }
    std::printf("revoked %s\n", revoke_id->c_str());
  });
}

void addAgentCommands(CLI::App& app, int& exit_code) {
  CLI::App* agent = app.add_subcommand("agent", "Forget agents that are gone.");
  agent->require_subcommand(1);
  auto dsn = std::make_shared<std::string>();
  auto region = std::make_shared<std::string>();
  auto id = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  CLI::App* remove = agent->add_subcommand(
      "remove", "Forget an agent (refused while it still sends heartbeats, unless --force).");
  remove->add_option("--dsn", *dsn, "Database (default: $KRANE_DSN)");
  remove->add_option("--region", *region, "its region")->required();
  remove->add_option("id", *id, "the agent's id (kranectl agents)")->required();
  remove->add_flag("--force", *force,
                   "remove it even though it sent a heartbeat in the last minute");
  remove->callback([dsn, region, id, force, &exit_code] {
    auto pool = openDatabase(*dsn);
    if (!pool.ok()) {
      exit_code = fail("agent remove", pool.status());
      return;
    }
    auto last_seen = ingest::Ingestor(*pool).removeAgent(*region, *id, *force);
    if (!last_seen.ok()) {
      exit_code = fail("agent remove", last_seen.status());
      return;
    }
    std::printf("removed agent %s of region %s (last heartbeat %lld s ago)\n", id->c_str(),
                region->c_str(), static_cast<long long>((unixMillis() - *last_seen) / 1000));
  });
}

void addFeedCommands(CLI::App& app, int& exit_code) {
  CLI::App* feed = app.add_subcommand("feed", "The change feed's epoch.");
  feed->require_subcommand(1);
  auto dsn = std::make_shared<std::string>();
  CLI::App* renew = feed->add_subcommand(
      "new-epoch",
      "Start a new epoch of the feed: every agent does a full sync. Run it after restoring the"
      " database from a backup.");
  renew->add_option("--dsn", *dsn, "Database (default: $KRANE_DSN)");
  renew->callback([dsn, &exit_code] {
    auto pool = openDatabase(*dsn);
    if (!pool.ok()) {
      exit_code = fail("feed new-epoch", pool.status());
      return;
    }
    auto conn = (*pool)->acquire();
    if (!conn.ok()) {
      exit_code = fail("feed new-epoch", conn.status());
      return;
    }
    auto changed = (*conn)->exec(
        "UPDATE feed_epoch SET epoch = CONV(SUBSTRING(MD5(UUID()), 1, 15), 16, 10) + 1,"
        " created_at = ? WHERE id = 1",
        {unixMillis()});
    if (!changed.ok()) {
      exit_code = fail("feed new-epoch", changed.status());
      return;
    }
    auto now = (*conn)->query("SELECT epoch FROM feed_epoch WHERE id = 1");
    std::printf(
        "the feed is at epoch %llu: every agent does a full sync when it next connects\n",
        now.ok() && !now->empty() ? static_cast<unsigned long long>(now->rows[0].u64(0)) : 0ull);
  });
}

}  // namespace krane::ctrl
