-- The rolling strategy's spec in full: surge and unavailable as a percentage of the desired
-- replicas (instead of a count) when set, and how long a new instance must be ready before it
-- counts as available; and the same spec on each deployment's topology, where the runtimes
-- read it (krane.cluster.v1.RollingUpdate as JSON, NULL for the defaults).
-- Never edit this file once applied: later changes go in a new numbered file.
ALTER TABLE environments
  ADD COLUMN max_surge_percent TINYINT UNSIGNED NULL AFTER max_unavailable,
  ADD COLUMN max_unavailable_percent TINYINT UNSIGNED NULL AFTER max_surge_percent,
  ADD COLUMN min_ready_seconds INT UNSIGNED NOT NULL DEFAULT 0 AFTER max_unavailable_percent;
ALTER TABLE deployment_topology
  ADD COLUMN rolling_update JSON NULL AFTER labels;
