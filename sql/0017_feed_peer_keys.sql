-- Each replica's CURVE public key for its hint socket (feed.peer_hints; docs/change-feed.md): the
-- other replicas encrypt to it, and it admits only subscribers whose keys are recorded here.
-- A replica makes a new key pair each time it starts. NULL: a replica of an earlier version,
-- which takes no hints from this one and gives it none (both still poll).
-- Never edit this file once applied: later changes go in a new numbered file.
ALTER TABLE feed_peers ADD COLUMN public_key CHAR(40) NULL AFTER endpoint;
