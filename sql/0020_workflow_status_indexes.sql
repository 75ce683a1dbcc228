-- Every change of an invocation's status (claimed, suspended, woken, finished) rewrote an entry
-- in each index that holds `status`. Two of those served only rare reads: retention's scan of
-- finished invocations, which an index on finished_at serves (only a finished invocation has
-- one, and it is written once), and listings and metrics by service and status, which the key
-- queue's index (service, object_key, status, key_seq) serves.
-- Never edit this file once applied: later changes go in a new numbered file.
ALTER TABLE workflow_invocations
  DROP INDEX workflow_invocations_status,
  DROP INDEX workflow_invocations_service,
  ADD KEY workflow_invocations_finished (finished_at);
