-- The version whose apply failed and was parked by the agent (0: none). A failure no longer
-- moves `applied_version`: the resource still runs the version applied before it, and reports of
-- that version (its instances, a crash, a move) keep being stored while the failure is shown.
-- A report of this version or a newer one clears it.
-- Never edit this file once applied: later changes go in a new numbered file.
ALTER TABLE resource_status
  ADD COLUMN failed_version BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER applied_version;
