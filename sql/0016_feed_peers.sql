-- The krane-ctrl replicas that take commit hints (feed.peer_hints; docs/change-feed.md): where
-- each one's hint socket is reached, and when it last said it was alive. A replica deletes its
-- row when it stops; the row of one that died is ignored once `seen_at` is older than the hints'
-- staleness limit.
-- Never edit this file once applied: later changes go in a new numbered file.
CREATE TABLE feed_peers (
  replica_id VARCHAR(128) NOT NULL,
  -- host:port of the replica's hint socket, as the other replicas reach it.
  endpoint VARCHAR(255) NOT NULL,
  seen_at BIGINT NOT NULL,
  PRIMARY KEY (replica_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
