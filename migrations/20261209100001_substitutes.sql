-- R20: the substitutes staff declare for a profile, in order of
-- preference: the profiles that may serve its orders when its own pool
-- cannot fill them (at most 8), for orders of `segments` only (empty: of
-- any segment or none). One row per profile of an organization; an empty
-- list is no row. "Equal or better" is the staff's declaration: nothing
-- here judges hardware. The checks repeat what the API refuses (the
-- profile itself, a NULL, too many); duplicates and unknown profiles are
-- refused by the writer, which reads the machines.
CREATE TABLE substitutes (
    org_id      bigint      NOT NULL REFERENCES organizations (id),
    profile     text        NOT NULL,
    substitutes text[]      NOT NULL,
    segments    text[]      NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_by  text        NOT NULL,
    PRIMARY KEY (org_id, profile),
    CONSTRAINT substitutes_count CHECK (cardinality(substitutes) BETWEEN 1 AND 8),
    CONSTRAINT substitutes_not_itself CHECK (NOT (profile = ANY (substitutes))),
    CONSTRAINT substitutes_no_null CHECK (array_position(substitutes, NULL) IS NULL
                                          AND array_position(segments, NULL) IS NULL),
    CONSTRAINT substitutes_segments_count CHECK (cardinality(segments) <= 16)
);

-- R20: a reserve may accept the declared substitutes ('allowed'; NULL or
-- 'none': the asked profile only). `profile_asked` is set by the
-- allocator itself on the request it walks a substitute's pool with (the
-- binary never sends it): the reservation's column of the same name.
ALTER TYPE reserve_request
    ADD ATTRIBUTE substitutes text,
    ADD ATTRIBUTE profile_asked text;
