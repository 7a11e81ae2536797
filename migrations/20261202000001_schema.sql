-- poolkeeper schema. Constraint and index names say what they protect; the
-- application maps unique violations to answers by these names (R6), so
-- renaming one is an API change.

-- Tenants. datacenter_enabled is the per-organization half of R12.
CREATE TABLE organizations (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slug               text        NOT NULL,
    name               text        NOT NULL,
    datacenter_enabled boolean     NOT NULL DEFAULT false,
    created_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT organizations_slug_unique UNIQUE (slug),
    CONSTRAINT organizations_slug_format CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$')
);

-- The pool. A machine's status is the datacenter team's word on it; whether
-- it is held or sold is derived from reservations and service links, never
-- stored twice.
CREATE TABLE machines (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    org_id     bigint      NOT NULL REFERENCES organizations (id),
    asset_tag  text        NOT NULL,
    site       text        NOT NULL,
    vendor     text        NOT NULL,
    profile    text        NOT NULL,
    status     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT machines_asset_tag_unique_per_org UNIQUE (org_id, asset_tag),
    CONSTRAINT machines_status_known
        CHECK (status IN ('ready', 'provisioning', 'maintenance', 'broken', 'retired'))
);

-- The allocator's walk: ready machines of one spec, in id order. Partial on
-- status so that the index stays the size of the sellable pool.
CREATE INDEX machines_candidates_idx
    ON machines (org_id, site, profile, vendor, id) WHERE status = 'ready';
-- Listing and filtering the whole pool (dashboard, explanation).
CREATE INDEX machines_by_site_idx ON machines (org_id, site, id);

-- R2: the states of a reservation, and which of them hold capacity. The
-- partial unique index below must agree with holds_capacity; a test reads
-- the index predicate from the catalog and compares.
CREATE TABLE reservation_states (
    state          text    PRIMARY KEY,
    holds_capacity boolean NOT NULL,
    description    text    NOT NULL
);
INSERT INTO reservation_states (state, holds_capacity, description) VALUES
    ('held',      true,  'reserved for an order, waiting for payment'),
    ('converted', false, 'payment cleared; the machine now belongs to a service link'),
    ('expired',   false, 'the hold ran out before conversion (nobody decided)'),
    ('cancelled', false, 'a person or the order service cancelled it (somebody decided)');

-- Fences of reservations come from one global sequence: a fence is never
-- reused, even after rows are purged.
CREATE SEQUENCE reservation_fence_seq AS bigint;

CREATE TABLE reservations (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    org_id       bigint      NOT NULL REFERENCES organizations (id),
    order_ref    text        NOT NULL,
    machine_id   bigint      NOT NULL REFERENCES machines (id),
    state        text        NOT NULL DEFAULT 'held' REFERENCES reservation_states (state),
    fence        bigint      NOT NULL DEFAULT nextval('reservation_fence_seq'),
    -- What the order asked for, and (R8) the frozen account of why this
    -- machine matched: its attributes at creation and the walk that chose it.
    spec         jsonb       NOT NULL,
    machine_snapshot jsonb   NOT NULL,
    reason       text        NOT NULL,
    hold_seconds integer     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at   timestamptz NOT NULL,
    -- How it ended: when, who or what (a staff email, a token name, 'sweep',
    -- 'conversion', 'allocator'), and why.
    ended_at     timestamptz,
    ended_by     text,
    end_reason   text,
    CONSTRAINT reservations_order_ref_unique_per_org UNIQUE (org_id, order_ref),
    CONSTRAINT reservations_hold_seconds_range CHECK (hold_seconds BETWEEN 1 AND 86400),
    CONSTRAINT reservations_expiry_after_creation CHECK (expires_at > created_at),
    CONSTRAINT reservations_end_recorded
        CHECK ((state = 'held') = (ended_at IS NULL AND ended_by IS NULL))
);

-- R1: the arbiter. Two reservations in a state that holds capacity can never
-- name the same machine, whatever the code does.
CREATE UNIQUE INDEX reservations_one_holder_per_machine
    ON reservations (machine_id) WHERE state = 'held';
-- The sweep: overdue held reservations in deadline order.
CREATE INDEX reservations_held_by_deadline_idx
    ON reservations (expires_at) WHERE state = 'held';
CREATE INDEX reservations_by_machine_idx ON reservations (machine_id, created_at);
CREATE INDEX reservations_ended_recently_idx ON reservations (org_id, ended_at)
    WHERE ended_at IS NOT NULL;

-- R10: a converted reservation becomes a service link; a live link excludes
-- its machine from every candidate list.
CREATE TABLE service_links (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    org_id         bigint      NOT NULL REFERENCES organizations (id),
    machine_id     bigint      NOT NULL REFERENCES machines (id),
    reservation_id bigint      NOT NULL REFERENCES reservations (id),
    service_ref    text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at       timestamptz,
    ended_by       text,
    CONSTRAINT service_links_one_per_reservation UNIQUE (reservation_id),
    CONSTRAINT service_links_end_recorded CHECK ((ended_at IS NULL) = (ended_by IS NULL))
);
CREATE UNIQUE INDEX service_links_one_live_per_machine
    ON service_links (machine_id) WHERE ended_at IS NULL;
CREATE INDEX service_links_by_machine_idx ON service_links (machine_id, created_at);

-- Every transition of a reservation, with its actor: the answer to "was this
-- order cancelled, or did it time out?" without reading logs.
CREATE TABLE reservation_events (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reservation_id bigint      NOT NULL REFERENCES reservations (id),
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind           text        NOT NULL,
    from_state     text        REFERENCES reservation_states (state),
    to_state       text        NOT NULL REFERENCES reservation_states (state),
    actor          text        NOT NULL,
    detail         text,
    -- Set when the sweep wrote it: the replica and the lease fence it held.
    replica        text,
    lease_fence    bigint,
    CONSTRAINT reservation_events_kind_known
        CHECK (kind IN ('created', 'converted', 'cancelled', 'expired'))
);
CREATE INDEX reservation_events_by_reservation_idx ON reservation_events (reservation_id, id);

-- L1: one lease row per job key. Times come from clock_timestamp(); the
-- fence comes from a sequence so that it stays monotonic after a purge (L4).
CREATE SEQUENCE lease_fence_seq AS bigint;
CREATE TABLE leases (
    key         text        PRIMARY KEY,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL DEFAULT nextval('lease_fence_seq'),
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL,
    CONSTRAINT leases_expiry_after_acquisition CHECK (expires_at > acquired_at)
);

-- What the sweep did, per run, for the Jobs page and for ops.
CREATE TABLE sweep_runs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    replica     text        NOT NULL,
    lease_fence bigint      NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    expired     integer     NOT NULL DEFAULT 0
);
CREATE INDEX sweep_runs_recent_idx ON sweep_runs (started_at DESC);

-- L6: a replica that fails to take or keep a lease because of an error says
-- so here as well as in its log, so that the Jobs page shows it.
CREATE TABLE lease_errors (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key     text        NOT NULL,
    replica text        NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    message text        NOT NULL
);
CREATE INDEX lease_errors_recent_idx ON lease_errors (at DESC);

-- Staff. Emails are unique across organizations: a person logs in with one.
CREATE TABLE users (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    org_id        bigint      NOT NULL REFERENCES organizations (id),
    email         text        NOT NULL,
    role          text        NOT NULL,
    password_hash text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    disabled_at   timestamptz,
    CONSTRAINT users_email_unique UNIQUE (email),
    CONSTRAINT users_role_known CHECK (role IN ('viewer', 'support', 'admin')),
    CONSTRAINT users_password_is_argon2id CHECK (password_hash LIKE '$argon2id$%')
);

-- Server-side sessions. The cookie carries a random token; only its SHA-256
-- is stored, so a database dump does not hand out live sessions.
CREATE TABLE sessions (
    token_hash   bytea       PRIMARY KEY,
    user_id      bigint      NOT NULL REFERENCES users (id),
    csrf_token   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at   timestamptz
);
CREATE INDEX sessions_by_user_idx ON sessions (user_id);

-- Failed and successful logins, per account and source, for throttling
-- shared across replicas.
CREATE TABLE login_attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    email       text        NOT NULL,
    source_addr text        NOT NULL,
    succeeded   boolean     NOT NULL
);
CREATE INDEX login_attempts_by_email_idx ON login_attempts (email, at);
CREATE INDEX login_attempts_by_source_idx ON login_attempts (source_addr, at);

-- API tokens: only a SHA-256 of the token is stored; the token is printed
-- once, at creation.
CREATE TABLE api_tokens (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    org_id     bigint      NOT NULL REFERENCES organizations (id),
    name       text        NOT NULL,
    token_hash bytea       NOT NULL,
    scopes     text[]      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at timestamptz,
    CONSTRAINT api_tokens_hash_unique UNIQUE (token_hash),
    CONSTRAINT api_tokens_name_unique_per_org UNIQUE (org_id, name),
    CONSTRAINT api_tokens_scopes_known
        CHECK (scopes <@ ARRAY['orders', 'inventory']::text[] AND cardinality(scopes) > 0)
);

-- Staff actions and logins: who, when, from where, on what. Never a password
-- or a token.
CREATE TABLE audit_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    org_id      bigint REFERENCES organizations (id),
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor       text        NOT NULL,
    action      text        NOT NULL,
    object      text,
    source_addr text,
    detail      text
);
CREATE INDEX audit_log_by_org_idx ON audit_log (org_id, at DESC);
