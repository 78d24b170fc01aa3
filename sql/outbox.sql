-- The transactional outbox of reconciler.
--
-- A service writes each lifecycle event of an operation into this table in
-- the same transaction that changes its own data; `reconciler relay`
-- publishes the committed rows to the input topic (ops.events), keyed by
-- entity, at least once and in each entity's commit order. A rolled-back
-- transaction leaves no row, so it publishes nothing.
--
-- Apply it once per database (`reconciler relay --install` runs this file;
-- every statement is idempotent). The table lives in the first schema of
-- the connection's search_path. Needs PostgreSQL 14 or later (CREATE OR
-- REPLACE TRIGGER). The relays LISTEN and set session options, so they
-- need a session of their own: not a pooler in transaction mode.
--
-- Writing from any language: one INSERT per event, inside the business
-- transaction.
--
--   INSERT INTO reconciler_outbox (entity_id, event) VALUES ($1, $2);
--
-- `event` is the Avro single-object encoding of an OperationEvent
-- (schemas/operation_event.avsc: 0xC3 0x01, the schema's 8-byte
-- fingerprint, the body), exactly the bytes a service would produce to
-- ops.events; `entity_id` is that event's entity_id, which becomes the
-- Kafka key. Two transactions that write events of one entity are
-- serialised by the trigger below (an advisory lock per entity, held to
-- commit), so row ids follow each entity's commit order and the relay
-- publishes in that order. A transaction that writes events of several
-- entities should write them in a fixed order (say, sorted by entity) so
-- that two such transactions cannot deadlock on those locks.
--
-- Keep the id sequence's CACHE at 1 (the default): with a cache each
-- session draws from a block of its own, and a writer that waited for the
-- entity's lock could draw a smaller id than the one it waited for. The
-- relay refuses to start on a cached sequence.
--
-- The NOTIFY on commit wakes the relays at once. PostgreSQL serialises the
-- commits of notifying transactions on one lock; on a database where that
-- costs too much, drop the trigger reconciler_outbox_notify: the relays
-- poll every [relay] poll_interval_ms anyway.

CREATE TABLE IF NOT EXISTS reconciler_outbox (
    id              bigserial   PRIMARY KEY,
    entity_id       text        NOT NULL CHECK (entity_id <> ''),
    event           bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- pending: waiting for the relay; published: acknowledged by the
    -- broker (published_at says when); dead_letter: failed max_attempts
    -- times, waiting for a person (last_error says why).
    status          text        NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'published', 'dead_letter')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    published_at    timestamptz
);

-- The relay's claim: pending rows in id order, and an entity's older
-- pending rows (only an entity's oldest pending row may be claimed).
CREATE INDEX IF NOT EXISTS reconciler_outbox_pending
    ON reconciler_outbox (id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS reconciler_outbox_pending_entity
    ON reconciler_outbox (entity_id, id) WHERE status = 'pending';
-- The dead-letter monitor: oldest first.
CREATE INDEX IF NOT EXISTS reconciler_outbox_dead_letter
    ON reconciler_outbox (created_at) WHERE status = 'dead_letter';

-- Who re-drove which dead letter, when and why: a dead letter re-driven
-- is pending again, and this is its audit trail.
CREATE TABLE IF NOT EXISTS reconciler_outbox_redrive (
    id          bigserial   PRIMARY KEY,
    outbox_id   bigint      NOT NULL,
    actor       text        NOT NULL,
    note        text        NOT NULL DEFAULT '',
    last_error  text,
    redriven_at timestamptz NOT NULL DEFAULT now()
);

-- Ids in commit order per entity: take the entity's lock (to commit), then
-- draw the id. The column default drew one already, before the lock; a
-- second transaction on the entity waits here and so draws a larger id
-- than the first, which has committed (or rolled back) by then.
CREATE OR REPLACE FUNCTION reconciler_outbox_order() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('reconciler_outbox:' || NEW.entity_id, 0));
    -- The table by its own schema, not the writer's search_path.
    NEW.id := nextval(pg_get_serial_sequence(format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME), 'id'));
    RETURN NEW;
END
$$;

-- Wakes the relays (LISTEN reconciler_outbox) when the transaction
-- commits; they also poll, so a lost notification delays and loses nothing.
CREATE OR REPLACE FUNCTION reconciler_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('reconciler_outbox', '');
    RETURN NULL;
END
$$;


CREATE OR REPLACE TRIGGER reconciler_outbox_order BEFORE INSERT ON reconciler_outbox
    FOR EACH ROW EXECUTE FUNCTION reconciler_outbox_order();

CREATE OR REPLACE TRIGGER reconciler_outbox_notify AFTER INSERT ON reconciler_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION reconciler_outbox_notify();
