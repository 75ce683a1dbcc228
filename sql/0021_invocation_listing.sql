-- Listings of invocations come newest first (kranectl workflow list, ListInvocations), by status
-- alone or with no filter at all. With no index on created_at each one read and sorted the whole
-- table, finished invocations included. An index on created_at is written once, when the
-- invocation is sent, and lets a listing read the newest rows first and stop at its limit.
-- Never edit this file once applied: later changes go in a new numbered file.
ALTER TABLE workflow_invocations ADD KEY workflow_invocations_created (created_at);
