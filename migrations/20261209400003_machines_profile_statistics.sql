-- R4, R7: the allocator's statements keep one generic plan per connection
-- (plan_cache_mode = force_generic_plan, sql/allocator.sql), so they are
-- planned for "some profile", whose share the planner takes as one over
-- the number of profiles it has seen. In an organization where one
-- profile fills the statistics (a fleet of mostly one model, or a profile
-- added since the last ANALYZE) that share is all of the site, and the
-- plans of a pool's candidates and counts walked machines_by_site_idx: a
-- sold-out pool's lookup read every machine of the site (143 buffers at
-- 1,000 machines a site), at every refusal and every reserve served by a
-- substitute. A fixed estimate of 50 profiles keeps those plans on the
-- pool's indexes whatever the statistics saw; it is an estimate for the
-- planner only (a real fleet has tens of profiles), applied at ANALYZE.
ALTER TABLE machines ALTER COLUMN profile SET (n_distinct = 50);
ANALYZE machines;
