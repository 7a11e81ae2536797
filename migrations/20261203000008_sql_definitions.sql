-- Which SQL definitions (sql/*.sql: functions, trigger functions, views)
-- are installed: per file, the SHA-256 of its content and the version of the
-- definition set (sql/VERSIONS) that installed or last confirmed it. The
-- installed version is the highest; an older binary never applies its own
-- set over a newer one (src/definitions.rs).
CREATE TABLE sql_definitions (
    file       text        PRIMARY KEY,
    checksum   bytea       NOT NULL,
    version    bigint      NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT sql_definitions_version_positive CHECK (version > 0)
);
