-- The durable workflow engine: invocations of service handlers, their journals, durable
-- promises (awakeables, timers, call results), the per-key locks of virtual objects and their
-- state. See docs/workflow.md for the execution model.
-- Never edit this file once applied: later changes go in a new numbered file.

-- One invocation of a handler. `due_at` is the single claim column: a row is claimable when
-- due_at <= now (scheduled: its delay is over, ready: runnable from that time on, running: its
-- lease expired, suspended: a timer it waits on is due). It is NULL otherwise.
CREATE TABLE workflow_invocations (
  id VARCHAR(64) NOT NULL,
  service VARCHAR(64) NOT NULL,
  handler VARCHAR(64) NOT NULL,
  -- The virtual object's key; '' for unkeyed services.
  object_key VARCHAR(255) NOT NULL DEFAULT '',
  -- Exclusive handlers of one key run one at a time in arrival order (key_seq).
  exclusive BOOLEAN NOT NULL,
  -- scheduled: delayed send not yet due. queued: waits for its key. ready: runnable.
  -- running: claimed by a worker under a lease. suspended: waits on promises, holds no thread.
  -- paused: retries ran out; an operator resumes or kills it.
  -- Final: succeeded, failed, cancelled, killed.
  status ENUM('scheduled', 'queued', 'ready', 'running', 'suspended', 'paused', 'succeeded',
              'failed', 'cancelled', 'killed') NOT NULL,
  input MEDIUMBLOB NOT NULL,
  output MEDIUMBLOB NULL,
  error_code INT NULL,
  error_message TEXT NULL,
  -- SHA-256 (hex) of service, handler, key and the caller's idempotency key.
  idempotency_hash CHAR(64) NULL,
  idempotency_key VARCHAR(255) NULL,
  -- The invocation that called this one, and the promise its result resolves.
  parent_id VARCHAR(64) NULL,
  completion_promise VARCHAR(128) NULL,
  key_seq BIGINT NULL,
  due_at BIGINT NULL,
  -- Bumped by every wake-up (a promise resolved, a cancel); a worker suspends only if it did
  -- not change since its claim, so no wake-up is lost.
  wake_seq BIGINT NOT NULL DEFAULT 0,
  cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
  -- Failed attempts (retryable errors) so far.
  attempts INT NOT NULL DEFAULT 0,
  -- Claims so far, including those after a worker died.
  claims INT NOT NULL DEFAULT 0,
  lease_owner VARCHAR(128) NULL,
  -- Fencing token: incremented by every claim, kill and resume; a worker commits only while the
  -- row still carries the token it claimed with.
  lease_token BIGINT NOT NULL DEFAULT 0,
  lease_expires_at BIGINT NULL,
  last_error TEXT NULL,
  created_at BIGINT NOT NULL,
  started_at BIGINT NULL,
  updated_at BIGINT NOT NULL,
  finished_at BIGINT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY workflow_invocations_idempotency (idempotency_hash),
  KEY workflow_invocations_due (due_at),
  KEY workflow_invocations_key_queue (service, object_key, status, key_seq),
  KEY workflow_invocations_status (status, finished_at),
  KEY workflow_invocations_service (service, handler, status)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The journal of an invocation: one row per operation, in the order the handler performed it.
-- A re-executed handler is answered from here (deterministic replay).
CREATE TABLE workflow_journal (
  invocation_id VARCHAR(64) NOT NULL,
  seq INT NOT NULL,
  -- run, get, set, clear, awakeable, timer, call, send, await, select, abort
  kind VARCHAR(16) NOT NULL,
  name VARCHAR(255) NOT NULL,
  ok BOOLEAN NOT NULL,
  payload MEDIUMBLOB NULL,
  error_code INT NULL,
  error_message TEXT NULL,
  duration_ms BIGINT NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (invocation_id, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Durable promises: awakeables (resolved from anywhere), timers (fire_at) and call results.
-- A promise is settled once, and its owner is woken when that happens.
CREATE TABLE workflow_promises (
  id VARCHAR(128) NOT NULL,
  invocation_id VARCHAR(64) NOT NULL,
  kind ENUM('awakeable', 'timer', 'call') NOT NULL,
  state ENUM('pending', 'resolved', 'rejected') NOT NULL DEFAULT 'pending',
  payload MEDIUMBLOB NULL,
  error_code INT NULL,
  error_message TEXT NULL,
  fire_at BIGINT NULL,
  created_at BIGINT NOT NULL,
  settled_at BIGINT NULL,
  PRIMARY KEY (id),
  KEY workflow_promises_invocation (invocation_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The lock of one virtual object: which exclusive invocation holds it, since when, and the
-- arrival counter that orders its queue.
CREATE TABLE workflow_keys (
  service VARCHAR(64) NOT NULL,
  object_key VARCHAR(255) NOT NULL,
  holder VARCHAR(64) NULL,
  held_since BIGINT NULL,
  next_seq BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (service, object_key),
  KEY workflow_keys_held (held_since)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Per-object state of virtual objects, written only by exclusive handlers.
CREATE TABLE workflow_state (
  service VARCHAR(64) NOT NULL,
  object_key VARCHAR(255) NOT NULL,
  name VARCHAR(255) NOT NULL,
  value MEDIUMBLOB NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (service, object_key, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
