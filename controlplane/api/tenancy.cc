#include "controlplane/api/tenancy.h"

#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/random_id.h"
#include "common/status.h"
#include "common/strings.h"
#include "controlplane/api/services.h"
#include "controlplane/db/errors.h"
#include "controlplane/strategy/rolling.h"

namespace krane::api {
namespace {

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// Input in a message, in this service's single quotes (krane::quote: short and printable).
std::string singleQuoted(std::string_view value) { return quote(value, 64, '\''); }

bool allowed(std::string_view text, bool underscore) {
  if (text.empty() || text.size() > 64) return false;
  for (char c : text) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (underscore && c == '_');
    if (!ok) return false;
  }
  return true;
}

// The id to use: the given one (checked) or a new one.
absl::StatusOr<std::string> idOf(const std::string& given, std::string_view prefix) {
  if (given.empty()) return newId(prefix);
  if (!allowed(given, true)) return invalid("id: 1-64 of a-z, 0-9, '_' and '-'");
  return given;
}

// The slug to use: the given one (checked) or one made from the name.
absl::StatusOr<std::string> slugOf(const std::string& given, const std::string& name) {
  std::string slug = given;
  if (slug.empty()) {
    for (char c : name) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
      if (ok) {
        slug += c;
      } else if (!slug.empty() && slug.back() != '-') {
        slug += '-';
      }
    }
    while (!slug.empty() && slug.back() == '-') slug.pop_back();
    if (slug.size() > 64) slug.resize(64);
  }
  if (!allowed(slug, false)) return invalid("slug: 1-64 of a-z, 0-9 and '-'");
  return slug;
}

absl::Status checkName(const std::string& name) {
  if (name.empty()) return invalid("name: required");
  if (name.size() > 255) return invalid("name: at most 255 bytes");
  return absl::OkStatus();
}

// A duplicate key names what is taken.
absl::Status taken(const absl::Status& s, std::string_view what) {
  if (db::mysqlErrno(s) == 1062) return absl::AlreadyExistsError(strCat(what, " is taken"));
  return s;
}

absl::Status parentExists(db::Connection& conn, std::string_view table, std::string_view field,
                          const std::string& id, std::string* workspace = nullptr,
                          std::string* project = nullptr) {
  if (id.empty()) return invalid(strCat(field, ": required"));
  KRANE_ASSIGN_OR_RETURN(
      auto rows,
      conn.query(strCat("SELECT * FROM ", table, " WHERE id = ? AND deleted_at IS NULL"), {id}));
  if (rows.empty())
    return absl::NotFoundError(
        strCat(field, ": no ", field.substr(0, field.size() - 3), " ", singleQuoted(id)));
  if (workspace != nullptr) *workspace = rows.rows[0].str("workspace_id");
  if (project != nullptr) *project = rows.rows[0].str("project_id");
  return absl::OkStatus();
}

}  // namespace

TenancyServiceImpl::TenancyServiceImpl(std::shared_ptr<db::Pool> pool,
                                       std::shared_ptr<const OperatorTokens> operators)
    : CheckedRequests("krane.api.v1.TenancyService"),
      pool_(std::move(pool)),
      operators_(std::move(operators)) {
  checkUnary("CreateWorkspace", this, &TenancyServiceImpl::CreateWorkspace);
  checkUnary("CreateProject", this, &TenancyServiceImpl::CreateProject);
  checkUnary("CreateApp", this, &TenancyServiceImpl::CreateApp);
  checkUnary("CreateEnvironment", this, &TenancyServiceImpl::CreateEnvironment);
}

grpc::Status TenancyServiceImpl::CreateWorkspace(grpc::ServerContext* context,
                                                 const v1::CreateWorkspaceRequest* request,
                                                 v1::Workspace* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = checkName(request->name()); !st.ok()) return toGrpc(st);
  auto id = idOf(request->id(), "ws");
  if (!id.ok()) return toGrpc(id.status());
  auto slug = slugOf(request->slug(), request->name());
  if (!slug.ok()) return toGrpc(slug.status());
  const uint32_t builds =
      request->max_concurrent_builds() == 0 ? 1 : request->max_concurrent_builds();
  if (builds > 1000) return toGrpc(invalid("max_concurrent_builds: at most 1000"));
  absl::Status s = pool_->transact("create workspace", [&](db::Connection& conn) -> absl::Status {
    const int64_t now = unixMillis();
    KRANE_RETURN_IF_ERROR(
        taken(conn.exec("INSERT INTO workspaces (id, name, slug, created_at)"
                        " VALUES (?, ?, ?, ?)",
                        {*id, request->name(), *slug, now})
                  .status(),
              strCat("workspace id ", singleQuoted(*id), " or slug ", singleQuoted(*slug))));
    return conn
        .exec("INSERT INTO quotas (workspace_id, max_concurrent_builds, created_at) VALUES (?,?,?)",
              {*id, builds, now})
        .status();
  });
  if (!s.ok()) return toGrpc(s);
  response->set_id(*id);
  response->set_name(request->name());
  response->set_slug(*slug);
  response->set_max_concurrent_builds(builds);
  return grpc::Status::OK;
}

grpc::Status TenancyServiceImpl::CreateProject(grpc::ServerContext* context,
                                               const v1::CreateProjectRequest* request,
                                               v1::Project* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = checkName(request->name()); !st.ok()) return toGrpc(st);
  auto id = idOf(request->id(), "proj");
  if (!id.ok()) return toGrpc(id.status());
  auto slug = slugOf(request->slug(), request->name());
  if (!slug.ok()) return toGrpc(slug.status());
  absl::Status s = pool_->transact("create project", [&](db::Connection& conn) -> absl::Status {
    KRANE_RETURN_IF_ERROR(
        parentExists(conn, "workspaces", "workspace_id", request->workspace_id()));
    return taken(conn.exec("INSERT INTO projects (id, workspace_id, name, slug, created_at)"
                           " VALUES (?, ?, ?, ?, ?)",
                           {*id, request->workspace_id(), request->name(), *slug, unixMillis()})
                     .status(),
                 strCat("project id ", singleQuoted(*id), " or slug ", singleQuoted(*slug)));
  });
  if (!s.ok()) return toGrpc(s);
  response->set_id(*id);
  response->set_workspace_id(request->workspace_id());
  response->set_name(request->name());
  response->set_slug(*slug);
  return grpc::Status::OK;
}

grpc::Status TenancyServiceImpl::CreateApp(grpc::ServerContext* context,
                                           const v1::CreateAppRequest* request, v1::App* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  if (auto st = checkName(request->name()); !st.ok()) return toGrpc(st);
  auto id = idOf(request->id(), "app");
  if (!id.ok()) return toGrpc(id.status());
  auto slug = slugOf(request->slug(), request->name());
  if (!slug.ok()) return toGrpc(slug.status());
  std::string workspace;
  absl::Status s = pool_->transact("create app", [&](db::Connection& conn) -> absl::Status {
    KRANE_RETURN_IF_ERROR(
        parentExists(conn, "projects", "project_id", request->project_id(), &workspace));
    return taken(
        conn.exec("INSERT INTO apps (id, workspace_id, project_id, name, slug,"
                  " created_at) VALUES (?, ?, ?, ?, ?, ?)",
                  {*id, workspace, request->project_id(), request->name(), *slug, unixMillis()})
            .status(),
        strCat("app id ", singleQuoted(*id), " or slug ", singleQuoted(*slug)));
  });
  if (!s.ok()) return toGrpc(s);
  response->set_id(*id);
  response->set_workspace_id(workspace);
  response->set_project_id(request->project_id());
  response->set_name(request->name());
  response->set_slug(*slug);
  return grpc::Status::OK;
}

grpc::Status TenancyServiceImpl::CreateEnvironment(grpc::ServerContext* context,
                                                   const v1::CreateEnvironmentRequest* request,
                                                   v1::Environment* response) {
  if (auto st = checkOperator(*context, *operators_); !st.ok()) return toGrpc(st);
  const v1::CreateEnvironmentRequest& r = *request;
  auto id = idOf(r.id(), "env");
  if (!id.ok()) return toGrpc(id.status());
  if (!allowed(r.slug(), false)) return toGrpc(invalid("slug: 1-64 of a-z, 0-9 and '-'"));
  if (r.kind() != "production" && r.kind() != "preview") {
    return toGrpc(invalid("kind: \"production\" or \"preview\""));
  }
  const std::string strategy = r.strategy().empty() ? "blue_green" : r.strategy();
  if (strategy != "blue_green" && strategy != "rolling") {
    return toGrpc(invalid("strategy: \"blue_green\" or \"rolling\""));
  }
  if (r.regions().empty()) return toGrpc(invalid("regions: at least one region"));
  for (int i = 0; i < r.regions_size(); ++i) {
    const auto& region = r.regions(i);
    if (region.region().empty())
      return toGrpc(invalid(strCat("regions[", i, "].region: required")));
    if (region.replicas() < 1 || region.replicas() > 1000) {
      return toGrpc(invalid(strCat("regions[", i, "].replicas: 1 to 1000")));
    }
    for (int j = 0; j < i; ++j) {
      if (r.regions(j).region() == region.region()) {
        return toGrpc(
            invalid(strCat("regions[", i, "].region: ", singleQuoted(region.region()), " twice")));
      }
    }
  }
  // The rolling spec: a count or a percentage each (strategy/rolling.h checks the whole).
  if (r.has_max_surge() && r.has_max_surge_percent()) {
    return toGrpc(invalid("max_surge, max_surge_percent: one or the other"));
  }
  if (r.has_max_unavailable() && r.has_max_unavailable_percent()) {
    return toGrpc(invalid("max_unavailable, max_unavailable_percent: one or the other"));
  }
  strategy::RollingSpec spec;
  spec.max_surge = r.has_max_surge_percent()
                       ? strategy::IntOrPercent{r.max_surge_percent(), true}
                       : strategy::IntOrPercent{r.has_max_surge() ? r.max_surge() : 1, false};
  spec.max_unavailable =
      r.has_max_unavailable_percent()
          ? strategy::IntOrPercent{r.max_unavailable_percent(), true}
          : strategy::IntOrPercent{r.has_max_unavailable() ? r.max_unavailable() : 0, false};
  if (auto st = strategy::checkSpec(spec); !st.ok()) {
    std::string message(toStd(st.message()));
    // Name the field the request used.
    if (r.has_max_surge_percent() && message.rfind("max_surge:", 0) == 0) {
      message = "max_surge_percent" + message.substr(std::string("max_surge").size());
    } else if (r.has_max_unavailable_percent() && message.rfind("max_unavailable:", 0) == 0) {
      message = "max_unavailable_percent" + message.substr(std::string("max_unavailable").size());
    }
    return toGrpc(invalid(message));
  }
  const uint32_t surge = spec.max_surge.percent ? 0 : spec.max_surge.value;
  const uint32_t unavailable = spec.max_unavailable.percent ? 0 : spec.max_unavailable.value;
  if (r.has_deploy_timeout_seconds() && r.deploy_timeout_seconds() == 0) {
    return toGrpc(invalid(
        "deploy_timeout_seconds: must be at least 1 (leave it unset for the default, 1800)"));
  }
  const uint32_t timeout = r.has_deploy_timeout_seconds() ? r.deploy_timeout_seconds() : 1800;
  if (timeout > 24 * 3600) return toGrpc(invalid("deploy_timeout_seconds: at most 86400"));
  if (r.min_ready_seconds() > 3600) return toGrpc(invalid("min_ready_seconds: at most 3600"));
  if (strategy == "rolling" && r.min_ready_seconds() >= timeout) {
    // A new instance counts as available only after min_ready_seconds: no roll could complete.
    return toGrpc(invalid(strCat("min_ready_seconds: must be below deploy_timeout_seconds (",
                                 timeout, "), or every rolling deploy rolls back")));
  }
  const db::Value surge_percent =
      spec.max_surge.percent ? db::Value(spec.max_surge.value) : db::Value();
  const db::Value unavailable_percent =
      spec.max_unavailable.percent ? db::Value(spec.max_unavailable.value) : db::Value();
  std::string workspace, project;
  absl::Status s = pool_->transact("create environment", [&](db::Connection& conn) -> absl::Status {
    KRANE_RETURN_IF_ERROR(parentExists(conn, "apps", "app_id", r.app_id(), &workspace, &project));
    for (int i = 0; i < r.regions_size(); ++i) {
      KRANE_ASSIGN_OR_RETURN(auto found, conn.query("SELECT 1 FROM regions WHERE id = ? AND"
                                                    " deleted_at IS NULL",
                                                    {r.regions(i).region()}));
      if (found.empty()) {
        return absl::NotFoundError(strCat("regions[", i, "].region: no region ",
                                          singleQuoted(r.regions(i).region()),
                                          " (krane-ctrl region add registers one)"));
      }
    }
    const int64_t now = unixMillis();
    KRANE_RETURN_IF_ERROR(
        taken(conn.exec("INSERT INTO environments (id, workspace_id, project_id, app_id, slug,"
                        " kind, strategy, max_surge, max_unavailable, max_surge_percent,"
                        " max_unavailable_percent, min_ready_seconds, deploy_timeout_seconds,"
                        " created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        {*id, workspace, project, r.app_id(), r.slug(), r.kind(), strategy, surge,
                         unavailable, surge_percent, unavailable_percent, r.min_ready_seconds(),
                         timeout, now})
                  .status(),
              strCat("environment id ", singleQuoted(*id), " or slug ", singleQuoted(r.slug()),
                     " of app ", singleQuoted(r.app_id()))));
    if (r.kind() == "production") {
      // An app has one live deployment (apps.current_deployment_id): one production environment.
      // Checked after the insert (a repeated request is told its id is taken) and under the
      // app's row lock, which concurrent creates and swaps take too.
      KRANE_RETURN_IF_ERROR(
          conn.query("SELECT id FROM apps WHERE id = ? FOR UPDATE", {r.app_id()}).status());
      KRANE_ASSIGN_OR_RETURN(auto production,
                             // A locking read: the latest committed rows, not the snapshot.
                             conn.query("SELECT id FROM environments WHERE app_id = ? AND"
                                        " kind = 'production' AND id <> ? AND deleted_at IS NULL"
                                        " LIMIT 1 FOR UPDATE",
                                        {r.app_id(), *id}));
      if (!production.empty()) {
        return absl::FailedPreconditionError(strCat(
            "kind: app ", singleQuoted(r.app_id()), " already has a production environment (",
            singleQuoted(production.rows[0].str("id")),
            "): an app has one live deployment; make this one a preview"));
      }
    }
    for (const auto& region : r.regions()) {
      KRANE_RETURN_IF_ERROR(conn.exec("INSERT INTO environment_regions (environment_id,"
                                      " region_id, replicas, created_at) VALUES (?,?,?,?)",
                                      {*id, region.region(), region.replicas(), now})
                                .status());
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return toGrpc(s);
  response->set_id(*id);
  response->set_app_id(r.app_id());
  response->set_slug(r.slug());
  response->set_kind(r.kind());
  *response->mutable_regions() = r.regions();
  response->set_strategy(strategy);
  response->set_max_surge(surge);
  response->set_max_unavailable(unavailable);
  response->set_deploy_timeout_seconds(timeout);
  if (spec.max_surge.percent) response->set_max_surge_percent(spec.max_surge.value);
  if (spec.max_unavailable.percent)
    response->set_max_unavailable_percent(spec.max_unavailable.value);
  response->set_min_ready_seconds(r.min_ready_seconds());
  return grpc::Status::OK;
}

}  // namespace krane::api
