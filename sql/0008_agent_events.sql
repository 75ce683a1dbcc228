-- What each agent's heartbeat says about changes it could not apply: parked (refused by a plugin
-- as invalid; acknowledged, waiting for a newer version) and retrying (failing for a transient
-- reason; the agent's cursor waits for them). Shown by `kranectl agents` and /metrics.
ALTER TABLE agents
  ADD COLUMN parked_events INT UNSIGNED NOT NULL DEFAULT 0,
  ADD COLUMN retrying_events INT UNSIGNED NOT NULL DEFAULT 0;
