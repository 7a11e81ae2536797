-- Issue 23: the filters of /machines, /why-not and /reservations are
-- selects filled with the organization's sites, vendors and profiles. Each
-- list is a skip scan (one index probe per distinct value) on an index that
-- leads with (org_id, column); sites already have machines_by_site_idx.
CREATE INDEX machines_by_vendor_idx ON machines (org_id, vendor);
CREATE INDEX machines_by_profile_idx ON machines (org_id, profile);
