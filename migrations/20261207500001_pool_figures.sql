-- R17: the machines of each pool, counted by what changes with inventory,
-- kept by the writes that change it instead of recounted on every read
-- (the overview, the capacity answer, the /machines header, Why not? and
-- the gauges read them). The cost of a read grows with the pools, not the
-- machines.
--
-- Two tables, written only by the statement triggers and the fold of
-- sql/pool_figures.sql: a writer of machines appends its statement's
-- changes to pool_figure_deltas (no row shared with another writer, so no
-- writer waits for another and none can deadlock on a figure); the sweep
-- folds the deltas into pool_figures. A reader sums both (the view
-- pool_machines), in one snapshot.
CREATE TABLE pool_figures (
    org_id     bigint  NOT NULL,
    site       text    NOT NULL,
    profile    text    NOT NULL,
    vendor     text    NOT NULL,
    status     text    NOT NULL,
    in_service boolean NOT NULL,
    machines   bigint  NOT NULL,
    PRIMARY KEY (org_id, site, profile, vendor, status, in_service)
);

-- Appended to, never updated; read whole by the view until folded, so
-- kept small by the fold and without an index.
CREATE TABLE pool_figure_deltas (
    org_id     bigint  NOT NULL,
    site       text    NOT NULL,
    profile    text    NOT NULL,
    vendor     text    NOT NULL,
    status     text    NOT NULL,
    in_service boolean NOT NULL,
    machines   bigint  NOT NULL
);
