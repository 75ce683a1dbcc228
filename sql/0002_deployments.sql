-- Deployments: what was asked for, how far the workflow got, the desired state per region the
-- agents apply, the instances they report, and the hostnames routed to deployments.
-- Never edit this file once applied: later changes go in a new numbered file.

CREATE TABLE deployments (
  id VARCHAR(64) NOT NULL,
  workspace_id VARCHAR(64) NOT NULL,
  project_id VARCHAR(64) NOT NULL,
  app_id VARCHAR(64) NOT NULL,
  environment_id VARCHAR(64) NOT NULL,
  -- Queued: pending, awaiting_approval. Active: starting (holds a build slot), building,
  -- deploying, network, finalizing. Final: ready, failed, superseded (a newer commit of the
  -- same app, environment and branch replaced it while queued), cancelled.
  status ENUM('pending', 'awaiting_approval', 'starting', 'building', 'deploying', 'network',
              'finalizing', 'ready', 'failed', 'superseded', 'cancelled') NOT NULL DEFAULT 'pending',
  git_branch VARCHAR(255) NULL,
  git_commit_sha VARCHAR(64) NULL,
  -- The image deployed: given by the caller, or set once the build produced it.
  image VARCHAR(512) NULL,
  -- The workflow invocation running this deployment, used to cancel it.
  invocation_id VARCHAR(128) NULL,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  PRIMARY KEY (id),
  -- Siblings for commit dedup and self-skip: same app, environment and branch, by status.
  KEY deployments_siblings (app_id, environment_id, git_branch, status),
  KEY deployments_environment_status (environment_id, status),
  KEY deployments_workspace_created (workspace_id, created_at),
  CONSTRAINT deployments_app_fk FOREIGN KEY (app_id) REFERENCES apps (id),
  CONSTRAINT deployments_environment_fk FOREIGN KEY (environment_id) REFERENCES environments (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

ALTER TABLE apps
  ADD CONSTRAINT apps_current_deployment_fk FOREIGN KEY (current_deployment_id) REFERENCES deployments (id);

-- Progress of a deployment, one row per workflow step, for the CLI's live view. An open step
-- has ended_at NULL. Cancelling a superseded deployment stamps its open steps with an error
-- (first write wins: only rows with ended_at NULL are updated).
CREATE TABLE deployment_steps (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  deployment_id VARCHAR(64) NOT NULL,
  -- Step name, e.g. 'building' or 'deploying'.
  step VARCHAR(64) NOT NULL,
  message VARCHAR(1024) NULL,
  started_at BIGINT NOT NULL,
  ended_at BIGINT NULL,
  error TEXT NULL,
  PRIMARY KEY (id),
  KEY deployment_steps_deployment (deployment_id, started_at),
  CONSTRAINT deployment_steps_deployment_fk FOREIGN KEY (deployment_id) REFERENCES deployments (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Desired state of one deployment in one region: resource type 'deployment_topology', id =
-- deployment_id (krane.cluster.v1.DeploymentTopology). Written only together with a
-- resource_changes row. JSON columns hold the proto3 JSON form of the matching field.
CREATE TABLE deployment_topology (
  deployment_id VARCHAR(64) NOT NULL,
  region_id VARCHAR(64) NOT NULL,
  workspace_id VARCHAR(64) NOT NULL,
  project_id VARCHAR(64) NOT NULL,
  app_id VARCHAR(64) NOT NULL,
  environment_id VARCHAR(64) NOT NULL,
  image VARCHAR(512) NOT NULL,
  -- JSON array of strings, NULL for the image's own.
  command JSON NULL,
  args JSON NULL,
  -- JSON array of {"name": ..., "value": ...} in order.
  env JSON NULL,
  port INT UNSIGNED NOT NULL DEFAULT 8080,
  -- krane.cluster.v1.Healthcheck as JSON, NULL for none.
  healthcheck JSON NULL,
  cpu_millicores INT UNSIGNED NOT NULL,
  memory_mib INT UNSIGNED NOT NULL,
  replicas INT UNSIGNED NOT NULL,
  -- All three set, or all NULL for a fixed replica count.
  autoscale_min_replicas INT UNSIGNED NULL,
  autoscale_max_replicas INT UNSIGNED NULL,
  autoscale_target_cpu_percent INT UNSIGNED NULL,
  shutdown_signal VARCHAR(16) NOT NULL DEFAULT 'SIGTERM',
  termination_grace_period_seconds INT UNSIGNED NOT NULL DEFAULT 30,
  desired_status ENUM('running', 'stopped') NOT NULL DEFAULT 'running',
  -- JSON object of extra labels.
  labels JSON NULL,
  -- Version of the latest change of this row (0 until the first change is recorded).
  version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  deleted_at BIGINT NULL,
  PRIMARY KEY (deployment_id, region_id),
  KEY deployment_topology_region_version (region_id, version),
  KEY deployment_topology_environment_region (environment_id, region_id),
  CONSTRAINT deployment_topology_deployment_fk FOREIGN KEY (deployment_id) REFERENCES deployments (id),
  CONSTRAINT deployment_topology_region_fk FOREIGN KEY (region_id) REFERENCES regions (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Instances of a deployment as the agent of a region last reported them. A report replaces
-- the whole set of its (deployment, region).
CREATE TABLE instances (
  deployment_id VARCHAR(64) NOT NULL,
  region_id VARCHAR(64) NOT NULL,
  -- Unique within the deployment and region, e.g. a pod name (up to 253 characters).
  id VARCHAR(255) NOT NULL,
  -- 'ip:port'
  address VARCHAR(255) NOT NULL,
  status ENUM('pending', 'running', 'failed') NOT NULL,
  failure_reason TEXT NULL,
  cpu_millicores INT UNSIGNED NULL,
  memory_mib INT UNSIGNED NULL,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (deployment_id, region_id, id),
  KEY instances_region_status (region_id, status)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A hostname routed to a deployment. `sticky` says which routes move when a new deployment
-- becomes ready: 'live' follows apps.current_deployment_id (promote, rollback), 'environment'
-- follows every new deployment of the environment, 'branch' every new deployment of the
-- branch, and 'none' stays on its deployment for good (the per-deployment hostname).
CREATE TABLE frontline_routes (
  id VARCHAR(64) NOT NULL,
  workspace_id VARCHAR(64) NOT NULL,
  project_id VARCHAR(64) NOT NULL,
  app_id VARCHAR(64) NOT NULL,
  environment_id VARCHAR(64) NOT NULL,
  deployment_id VARCHAR(64) NOT NULL,
  hostname VARCHAR(255) NOT NULL,
  sticky ENUM('none', 'branch', 'environment', 'live') NOT NULL DEFAULT 'none',
  -- Branch followed by a 'branch' route.
  git_branch VARCHAR(255) NULL,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY frontline_routes_hostname (hostname),
  KEY frontline_routes_deployment (deployment_id),
  KEY frontline_routes_environment_sticky (environment_id, sticky),
  CONSTRAINT frontline_routes_deployment_fk FOREIGN KEY (deployment_id) REFERENCES deployments (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
