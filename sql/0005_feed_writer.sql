-- Desired state can be written through the low-level resource API without the tenancy and
-- deployment rows a deploy workflow creates (plugin authors, the demo, operators). The region
-- remains a foreign key: a change always belongs to a registered region.
ALTER TABLE deployment_topology DROP FOREIGN KEY deployment_topology_deployment_fk;
ALTER TABLE sentinels DROP FOREIGN KEY sentinels_environment_fk;
ALTER TABLE cilium_network_policies DROP FOREIGN KEY cilium_network_policies_environment_fk;

-- The last status an agent reported for a resource of any type (ReportResourceStatus), including
-- failures to apply it.
CREATE TABLE resource_status (
  region_id VARCHAR(64) NOT NULL,
  resource_type VARCHAR(64) NOT NULL,
  resource_id VARCHAR(64) NOT NULL,
  -- Version of the resource the agent had applied when it reported.
  applied_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  phase VARCHAR(32) NOT NULL,
  message TEXT NULL,
  detail LONGBLOB NULL,
  apply_error TEXT NULL,
  apply_attempts INT UNSIGNED NOT NULL DEFAULT 0,
  agent_id VARCHAR(128) NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (region_id, resource_type, resource_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
