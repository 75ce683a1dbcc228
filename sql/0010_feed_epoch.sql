-- The feed's epoch: a random number that changes whenever the feed's history stops being a
-- continuation of what agents may have seen (a database restored from a backup: run
-- `krane-ctrl feed new-epoch` after a restore; krane-ctrl also changes it by itself when an agent
-- of the current epoch holds a cursor ahead of its region). Agents keep it with their cursor and
-- resync when it differs.
CREATE TABLE feed_epoch (
  id TINYINT UNSIGNED NOT NULL,
  epoch BIGINT UNSIGNED NOT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT INTO feed_epoch (id, epoch, created_at)
VALUES (1, CONV(SUBSTRING(MD5(UUID()), 1, 15), 16, 10) + 1,
        CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED));
