-- R21: each pool's counts and flows per UTC day, written once per pool and
-- day by the sweep's holder (src/planning.rs) from the rows kept anyway, so
-- that a day rebuilt later equals the day written as it closed.

-- Every change of a machine's organization, site, profile or status (and
-- its deletion: site, profile and status NULL), at the time it was made:
-- the day-end state of a pool is the last change of each machine before
-- the day's end, whatever changed since. Written by the statement triggers
-- of sql/planning.sql, which first fill it with each machine as it is now,
-- dated at its creation (the history before this table is not known).
CREATE TABLE machine_changes (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine_id bigint      NOT NULL,
    org_id     bigint      NOT NULL,
    at         timestamptz NOT NULL,
    site       text,
    profile    text,
    status     text,
    CONSTRAINT machine_changes_deleted_whole
        CHECK ((site IS NULL) = (status IS NULL) AND (profile IS NULL) = (status IS NULL))
);
CREATE INDEX machine_changes_by_machine_idx ON machine_changes (machine_id, at, id);

-- One row per pool (organization, site, profile) and UTC day: the counts at
-- the day's end (as R17 counts them: total = sellable + held + sold +
-- not_ready) and the day's flows. `demand` is R21's true demand: sales of
-- what was asked, refusals for want of stock and orders served by a
-- substitute, counted against the pool that was asked.
CREATE TABLE pool_days (
    org_id                 bigint NOT NULL REFERENCES organizations (id),
    site                   text   NOT NULL,
    profile                text   NOT NULL,
    day                    date   NOT NULL,
    total                  bigint NOT NULL,
    sellable               bigint NOT NULL,
    held                   bigint NOT NULL,
    sold                   bigint NOT NULL,
    not_ready              bigint NOT NULL,
    created                bigint NOT NULL,
    converted              bigint NOT NULL,
    expired                bigint NOT NULL,
    cancelled              bigint NOT NULL,
    refused_unavailable    bigint NOT NULL,
    refused_contended      bigint NOT NULL,
    refused_reserved       bigint NOT NULL,
    refused_customer_limit bigint NOT NULL,
    substituted_in         bigint NOT NULL,
    substituted_out        bigint NOT NULL,
    added                  bigint NOT NULL,
    retired                bigint NOT NULL,
    demand                 bigint NOT NULL,
    -- Who wrote it: the sweep's replica and its lease fence.
    replica                text   NOT NULL,
    lease_fence            bigint NOT NULL,
    PRIMARY KEY (org_id, site, profile, day),
    CONSTRAINT pool_days_states_add_up CHECK (total = sellable + held + sold + not_ready),
    CONSTRAINT pool_days_not_negative CHECK (least(sellable, held, sold, not_ready, created, converted,
        expired, cancelled, refused_unavailable, refused_contended, refused_reserved,
        refused_customer_limit, substituted_in, substituted_out, added, retired, demand) >= 0)
);
-- The planning page and the API read an organization's last days.
CREATE INDEX pool_days_by_org_day_idx ON pool_days (org_id, day);

-- One row: every day up to `through` is in pool_days. It starts the day
-- before the oldest row kept (at most two years back), so that the first
-- holder after the upgrade rebuilds the past day by day with the very job
-- that writes each new day.
CREATE TABLE pool_days_written (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    through date    NOT NULL
);
WITH today AS (SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date AS d),
first AS (
    SELECT least((SELECT min(created_at) FROM machines),
                 (SELECT min(created_at) FROM reservations),
                 (SELECT min(at) FROM reservation_refusals)) AS at
)
INSERT INTO pool_days_written (through)
SELECT CASE WHEN first.at IS NULL THEN today.d - 1
            ELSE greatest((first.at AT TIME ZONE 'UTC')::date - 1, today.d - 731) END
  FROM today, first;

-- R21: the procurement lead time of a site, set by staff (30 days when no
-- row says otherwise).
CREATE TABLE site_lead_times (
    org_id         bigint      NOT NULL REFERENCES organizations (id),
    site           text        NOT NULL,
    lead_time_days integer     NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_by     text        NOT NULL,
    PRIMARY KEY (org_id, site),
    CONSTRAINT site_lead_times_range CHECK (lead_time_days BETWEEN 1 AND 730)
);
