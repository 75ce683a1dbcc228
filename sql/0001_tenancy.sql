-- Tenancy: workspaces, their projects, apps and environments, the regions Krane deploys to,
-- and per-workspace quotas.
--
-- Conventions for every Krane table: ids are opaque strings (VARCHAR(64)), timestamps are Unix
-- epoch milliseconds (BIGINT), rows that may be removed carry `deleted_at` (soft delete), and
-- tables are InnoDB, utf8mb4 with binary collation (ids and names compare exactly).
-- Never edit this file once applied: later changes go in a new numbered file.

CREATE TABLE workspaces (
  id VARCHAR(64) NOT NULL,
  name VARCHAR(255) NOT NULL,
  slug VARCHAR(64) NOT NULL,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  deleted_at BIGINT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY workspaces_slug (slug)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Limits of one workspace. A workspace without a row gets the defaults in code.
CREATE TABLE quotas (
  workspace_id VARCHAR(64) NOT NULL,
  -- How many deployments of the workspace may build at once (build slots).
  max_concurrent_builds INT UNSIGNED NOT NULL DEFAULT 1,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  PRIMARY KEY (workspace_id),
  CONSTRAINT quotas_workspace_fk FOREIGN KEY (workspace_id) REFERENCES workspaces (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE projects (
  id VARCHAR(64) NOT NULL,
  workspace_id VARCHAR(64) NOT NULL,
  name VARCHAR(255) NOT NULL,
  slug VARCHAR(64) NOT NULL,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  deleted_at BIGINT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY projects_workspace_slug (workspace_id, slug),
  CONSTRAINT projects_workspace_fk FOREIGN KEY (workspace_id) REFERENCES workspaces (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One deployable application of a project.
CREATE TABLE apps (
  id VARCHAR(64) NOT NULL,
  workspace_id VARCHAR(64) NOT NULL,
  project_id VARCHAR(64) NOT NULL,
  name VARCHAR(255) NOT NULL,
  slug VARCHAR(64) NOT NULL,
  -- The deployment serving the app's production traffic (live routes point at it). Changed
  -- only by the routing service, serialized per environment.
  current_deployment_id VARCHAR(64) NULL,
  -- True after a rollback: new deployments stop being promoted automatically until an
  -- explicit promote clears it.
  is_rolled_back BOOLEAN NOT NULL DEFAULT FALSE,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  deleted_at BIGINT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY apps_project_slug (project_id, slug),
  KEY apps_workspace (workspace_id),
  CONSTRAINT apps_project_fk FOREIGN KEY (project_id) REFERENCES projects (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- An environment of an app (production, or a preview) and how deployments roll out in it.
CREATE TABLE environments (
  id VARCHAR(64) NOT NULL,
  workspace_id VARCHAR(64) NOT NULL,
  project_id VARCHAR(64) NOT NULL,
  app_id VARCHAR(64) NOT NULL,
  slug VARCHAR(64) NOT NULL,
  -- Production deployments get build slots before preview ones.
  kind ENUM('production', 'preview') NOT NULL,
  -- blue_green: the new deployment is started in full, then traffic swaps at once.
  -- rolling: replicas move from the old deployment to the new one in steps bounded by
  -- max_surge (extra replicas above the desired count) and max_unavailable.
  strategy ENUM('blue_green', 'rolling') NOT NULL DEFAULT 'blue_green',
  max_surge INT UNSIGNED NOT NULL DEFAULT 1,
  max_unavailable INT UNSIGNED NOT NULL DEFAULT 0,
  -- A deployment still not ready after this long fails (and, rolling, is rolled back).
  deploy_timeout_seconds INT UNSIGNED NOT NULL DEFAULT 1800,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  deleted_at BIGINT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY environments_app_slug (app_id, slug),
  KEY environments_project (project_id),
  CONSTRAINT environments_app_fk FOREIGN KEY (app_id) REFERENCES apps (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A cluster Krane deploys to, served by one agent. `id` is the region name used everywhere
-- else (e.g. 'eu-central-1').
CREATE TABLE regions (
  id VARCHAR(64) NOT NULL,
  display_name VARCHAR(255) NOT NULL,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  deleted_at BIGINT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The regions an environment deploys to, with the replica count new deployments get there.
CREATE TABLE environment_regions (
  environment_id VARCHAR(64) NOT NULL,
  region_id VARCHAR(64) NOT NULL,
  replicas INT UNSIGNED NOT NULL DEFAULT 1,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  PRIMARY KEY (environment_id, region_id),
  KEY environment_regions_region (region_id),
  CONSTRAINT environment_regions_environment_fk FOREIGN KEY (environment_id) REFERENCES environments (id),
  CONSTRAINT environment_regions_region_fk FOREIGN KEY (region_id) REFERENCES regions (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
