-- The change feed and the agents: plugin-defined resources, the change table streamed to
-- agents, the per-region version counter, agent credentials and agent heartbeats.
-- Never edit this file once applied: later changes go in a new numbered file.

-- Resources of any type a plugin declares (krane.cluster.v1.GenericResource), stored without
-- a table of their own. A deleted resource keeps its row (deleted_at set) until a new put of
-- the same (type, id) revives it.
CREATE TABLE resources (
  type VARCHAR(64) NOT NULL,
  id VARCHAR(64) NOT NULL,
  region_id VARCHAR(64) NOT NULL,
  workspace_id VARCHAR(64) NULL,
  spec LONGBLOB NOT NULL,
  content_type VARCHAR(255) NOT NULL,
  version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NULL,
  deleted_at BIGINT NULL,
  PRIMARY KEY (type, id),
  KEY resources_region_type (region_id, type, version),
  KEY resources_workspace (workspace_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per change of desired state, written in the same transaction as the state row it
-- points at. It holds no state: the tailer loads the resource from its table.
-- `version` counts up per region in commit order (taken from region_versions), so a reader
-- that has seen version N of a region has seen every change up to N. `pk` only gives rows a
-- key. Old rows are pruned by created_at in batches.
CREATE TABLE resource_changes (
  pk BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  region_id VARCHAR(64) NOT NULL,
  -- A string, not an enum: plugins add types without a schema change.
  resource_type VARCHAR(64) NOT NULL,
  resource_id VARCHAR(64) NOT NULL,
  op ENUM('apply', 'delete') NOT NULL,
  version BIGINT UNSIGNED NOT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (pk),
  UNIQUE KEY resource_changes_region_version (region_id, version),
  KEY resource_changes_region_type_version (region_id, resource_type, version),
  KEY resource_changes_created_at (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The version counter of each region. A transaction that changes desired state increments its
-- region's row as the last statement before commit. The row lock orders the writers of a
-- region, so versions are handed out in commit order and no reader can pass a version whose
-- transaction is still open.
CREATE TABLE region_versions (
  region_id VARCHAR(64) NOT NULL,
  -- Latest version handed out.
  version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  -- Pruning has deleted every change up to this version. A cursor below it cannot resume
  -- and gets "cursor expired".
  pruned_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  PRIMARY KEY (region_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Start every existing region's counter above the versions already stamped on its rows.
INSERT INTO region_versions (region_id, version)
SELECT r.id, GREATEST(
  COALESCE((SELECT MAX(t.version) FROM deployment_topology t WHERE t.region_id = r.id), 0),
  COALESCE((SELECT MAX(s.version) FROM sentinels s WHERE s.region_id = r.id), 0),
  COALESCE((SELECT MAX(c.version) FROM cilium_network_policies c WHERE c.region_id = r.id), 0))
FROM regions r;

-- Credentials of agents: one region each. Only the SHA-256 of the token is stored.
CREATE TABLE agent_tokens (
  id VARCHAR(64) NOT NULL,
  region_id VARCHAR(64) NOT NULL,
  name VARCHAR(255) NOT NULL,
  token_hash BINARY(32) NOT NULL,
  created_at BIGINT NOT NULL,
  revoked_at BIGINT NULL,
  last_used_at BIGINT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY agent_tokens_hash (token_hash),
  KEY agent_tokens_region (region_id),
  CONSTRAINT agent_tokens_region_fk FOREIGN KEY (region_id) REFERENCES regions (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The latest heartbeat of each agent replica, to show who leads a region and how far behind
-- it is (region_versions.version minus applied_version).
CREATE TABLE agents (
  region_id VARCHAR(64) NOT NULL,
  agent_id VARCHAR(128) NOT NULL,
  build_version VARCHAR(128) NOT NULL,
  applied_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  is_leader BOOLEAN NOT NULL DEFAULT FALSE,
  -- JSON array of krane.cluster.v1.PluginInfo.
  plugins JSON NULL,
  first_seen_at BIGINT NOT NULL,
  last_seen_at BIGINT NOT NULL,
  PRIMARY KEY (region_id, agent_id),
  KEY agents_last_seen (last_seen_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
