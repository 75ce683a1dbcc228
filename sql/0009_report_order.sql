-- Status reports carry the reporting agent and when it observed what it reports, so that an
-- older report (a retried one, or one from a replaced leader) never overwrites a newer one.
ALTER TABLE resource_status
  ADD COLUMN observed_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sentinels
  ADD COLUMN status_agent_id VARCHAR(128) NULL,
  ADD COLUMN status_observed_at BIGINT NOT NULL DEFAULT 0;
