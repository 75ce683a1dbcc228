-- Revisions and phase history of rolling deploys.
-- Never edit this file once applied: later changes go in a new numbered file.
--
-- apps.deploying_deployment_id: the deployment a rolling deploy is moving the app to, while it
-- does (apps.current_deployment_id is the one it moves from). The swap that completes the roll
-- sets current = deploying and deploying = NULL in one transaction; a rollback clears it.
ALTER TABLE apps
  ADD COLUMN deploying_deployment_id VARCHAR(64) NULL AFTER current_deployment_id;

-- instances.running_since: when the instance was first reported running without a break since
-- (NULL while it is not running): a rolling deploy counts a new instance as available only
-- min_ready_seconds after it.
ALTER TABLE instances
  ADD COLUMN running_since BIGINT NULL AFTER failure_reason;

-- What a rolling deploy did, per region and phase: provisioning (waiting for new instances),
-- progressing (instances created or drained), completed, rolling_back. A cycle that finds the
-- same phase with the same detail (the failure of a new instance, or why it rolls back) as the
-- region's latest record only counts one more attempt: phase_started_at stays when the phase
-- began, however often it was retried.
CREATE TABLE deployment_phases (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  deployment_id VARCHAR(64) NOT NULL,
  region_id VARCHAR(64) NOT NULL,
  phase VARCHAR(32) NOT NULL,
  detail VARCHAR(1024) NOT NULL DEFAULT '',
  phase_started_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  attempts INT UNSIGNED NOT NULL DEFAULT 1,
  PRIMARY KEY (id),
  KEY deployment_phases_region (deployment_id, region_id, id),
  CONSTRAINT deployment_phases_deployment_fk FOREIGN KEY (deployment_id) REFERENCES deployments (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
