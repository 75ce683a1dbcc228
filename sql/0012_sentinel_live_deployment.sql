-- What a sentinel routes to and how its own instances are probed (krane.cluster.v1.Sentinel
-- live_deployment_id, rolling_deployment_id and healthcheck). Desired columns: written only through the feed writer,
-- together with a resource_changes row.
-- Never edit this file once applied: later changes go in a new numbered file.

ALTER TABLE sentinels
  -- The environment's live deployment, set by the routing service in the transaction of each
  -- swap (deploy, promote, rollback); NULL while the environment has none.
  ADD COLUMN live_deployment_id VARCHAR(64) NULL AFTER config,
  -- Liveness and readiness probes (krane.cluster.v1.Healthcheck as JSON); NULL: the defaults.
  ADD COLUMN healthcheck JSON NULL AFTER live_deployment_id,
  -- A rolling deploy's new deployment, routed to together with the live one until the swap.
  ADD COLUMN rolling_deployment_id VARCHAR(64) NULL AFTER healthcheck;
