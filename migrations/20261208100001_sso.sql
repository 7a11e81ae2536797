-- S1-S3: an organization's staff may sign in through its OpenID Connect
-- provider. The client secret is never stored here: only the path of the
-- file the server reads it from.
CREATE TABLE org_sso (
    org_id             bigint      PRIMARY KEY REFERENCES organizations (id),
    issuer             text        NOT NULL,
    client_id          text        NOT NULL,
    client_secret_file text        NOT NULL,
    claim              text        NOT NULL DEFAULT 'groups',
    admin_value        text,
    support_value      text,
    viewer_value       text,
    -- S2: 'admins' keeps password sign-in for admins only (break-glass).
    passwords          text        NOT NULL DEFAULT 'on',
    updated_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT org_sso_passwords_known CHECK (passwords IN ('on', 'admins')),
    CONSTRAINT org_sso_maps_a_role
        CHECK (coalesce(admin_value, support_value, viewer_value) IS NOT NULL)
);

-- S1: a sign-in under way, from the redirect to the provider until its
-- callback, which consumes the row (state is single-use). Keyed by the
-- SHA-256 of state, bound to the browser by the SHA-256 of a cookie; the
-- nonce and the PKCE verifier live no longer than the row (10 minutes).
CREATE TABLE sso_pending (
    state_hash    bytea       PRIMARY KEY,
    browser_hash  bytea       NOT NULL,
    org_id        bigint      NOT NULL REFERENCES organizations (id),
    nonce         text        NOT NULL,
    pkce_verifier text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX sso_pending_by_age_idx ON sso_pending (created_at);

-- S1: the provider's subject of a user who signed in through it; the user
-- is found by it at the next sign-in, whatever their email became.
ALTER TABLE users ADD COLUMN sso_subject text;
CREATE UNIQUE INDEX users_sso_subject_unique ON users (org_id, sso_subject)
    WHERE sso_subject IS NOT NULL;
