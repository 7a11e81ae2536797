-- S1: several values of the role claim may give one role (two admin
-- groups, a group renamed while the old name is still in use). The
-- single-value columns stay and hold the first value, for the previous
-- release's binaries while both run; a single value that is not among the
-- list was written by such a binary, and is then read as the list.
ALTER TABLE org_sso
    ADD COLUMN admin_values   text[] NOT NULL DEFAULT '{}',
    ADD COLUMN support_values text[] NOT NULL DEFAULT '{}',
    ADD COLUMN viewer_values  text[] NOT NULL DEFAULT '{}';
UPDATE org_sso
   SET admin_values   = CASE WHEN admin_value   IS NULL THEN '{}' ELSE ARRAY[admin_value]   END,
       support_values = CASE WHEN support_value IS NULL THEN '{}' ELSE ARRAY[support_value] END,
       viewer_values  = CASE WHEN viewer_value  IS NULL THEN '{}' ELSE ARRAY[viewer_value]  END;
ALTER TABLE org_sso
    ADD CONSTRAINT org_sso_values_not_blank
        CHECK (array_position(admin_values || support_values || viewer_values, '') IS NULL
               AND array_position(admin_values || support_values || viewer_values, NULL) IS NULL);

-- S1: the person's name as the provider gives it (the ID token's `name`,
-- else the email), refreshed at every sign-in; NULL for a user who never
-- signed in through a provider.
ALTER TABLE users
    ADD COLUMN display_name text
        CONSTRAINT users_display_name_length CHECK (char_length(display_name) BETWEEN 1 AND 320);

-- The actor's name when the entry was written, beside the email in actor.
ALTER TABLE audit_log ADD COLUMN actor_name text;

-- S1: the sign-ins started at /login/sso from each client address that
-- have not completed (a completed sign-in deletes its row; an unknown
-- organization's name never completes): the bound per address counts them.
CREATE TABLE sso_starts (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source_addr text        NOT NULL,
    state_hash  bytea,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX sso_starts_by_source_idx ON sso_starts (source_addr, at);
CREATE UNIQUE INDEX sso_starts_by_state_idx ON sso_starts (state_hash)
    WHERE state_hash IS NOT NULL;
