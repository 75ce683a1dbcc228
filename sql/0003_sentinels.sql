-- Sentinels (the routing proxy of each environment in each region) and Cilium network
-- policies: desired state streamed to agents next to deployment_topology.
-- Never edit this file once applied: later changes go in a new numbered file.

-- Resource type 'sentinel', id = sentinels.id (krane.cluster.v1.Sentinel). The desired
-- columns change only together with a resource_changes row and a new version. The observed
-- columns are written from the agent's status reports and change no version.
CREATE TABLE sentinels (
  id VARCHAR(64) NOT NULL,
  workspace_id VARCHAR(64) NOT NULL,
  project_id VARCHAR(64) NOT NULL,
  app_id VARCHAR(64) NOT NULL,
  environment_id VARCHAR(64) NOT NULL,
  region_id VARCHAR(64) NOT NULL,
  -- Desired.
  image VARCHAR(512) NOT NULL,
  desired_state ENUM('running', 'standby', 'archived') NOT NULL DEFAULT 'running',
  replicas INT UNSIGNED NOT NULL,
  cpu_millicores INT UNSIGNED NOT NULL,
  memory_mib INT UNSIGNED NOT NULL,
  -- The sentinel's own configuration document, passed through unchanged.
  config JSON NULL,
  -- Convergence of the last SentinelService.Deploy: idle (none yet), progressing (waiting
  -- for the agent to report the image healthy), ready, failed (timed out).
  deploy_status ENUM('idle', 'progressing', 'ready', 'failed') NOT NULL DEFAULT 'idle',
  -- Observed.
  available_replicas INT UNSIGNED NOT NULL DEFAULT 0,
  updated_replicas INT UNSIGNED NOT NULL DEFAULT 0,
  ready_replicas INT UNSIGNED NOT NULL DEFAULT 0,
  observed_generation BIGINT NOT NULL DEFAULT 0,
  running_image VARCHAR(512) NULL,
  health ENUM('unknown', 'healthy', 'unhealthy', 'paused') NOT NULL DEFAULT 'unknown',
  status_reported_at BIGINT NULL,
  -- Version of the latest change of this row (0 until the first change is recorded).
  version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  deleted_at BIGINT NULL,
  PRIMARY KEY (id),
  KEY sentinels_region_version (region_id, version),
  KEY sentinels_environment_region (environment_id, region_id),
  -- Fleet rollouts page through the running sentinels.
  KEY sentinels_desired_state (desired_state, id),
  CONSTRAINT sentinels_environment_fk FOREIGN KEY (environment_id) REFERENCES environments (id),
  CONSTRAINT sentinels_region_fk FOREIGN KEY (region_id) REFERENCES regions (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Resource type 'cilium_network_policy', id = cilium_network_policies.id
-- (krane.cluster.v1.CiliumNetworkPolicy). Written only together with a resource_changes row.
CREATE TABLE cilium_network_policies (
  id VARCHAR(64) NOT NULL,
  workspace_id VARCHAR(64) NOT NULL,
  project_id VARCHAR(64) NOT NULL,
  environment_id VARCHAR(64) NOT NULL,
  region_id VARCHAR(64) NOT NULL,
  -- Object name in the cluster, NULL to derive it from the id.
  name VARCHAR(253) NULL,
  -- The CiliumNetworkPolicy object (or its spec) as JSON.
  policy JSON NOT NULL,
  version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  deleted_at BIGINT NULL,
  PRIMARY KEY (id),
  KEY cilium_network_policies_region_version (region_id, version),
  KEY cilium_network_policies_environment_region (environment_id, region_id),
  CONSTRAINT cilium_network_policies_environment_fk FOREIGN KEY (environment_id) REFERENCES environments (id),
  CONSTRAINT cilium_network_policies_region_fk FOREIGN KEY (region_id) REFERENCES regions (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
