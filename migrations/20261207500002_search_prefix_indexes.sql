-- The dashboard's search: asset tags and order refs by prefix, whatever the
-- case, on an index. `lower(x)` under text_pattern_ops orders by bytes, so
-- a prefix is one range of it (src/dashboard/search.rs writes the range);
-- the plain indexes on (org_id, asset_tag) and (org_id, order_ref) keep the
-- exact matches. A B-tree, not a trigram index: a prefix is all the search
-- asks, and a reserve pays one B-tree entry, not a GIN update.
CREATE INDEX machines_asset_tag_prefix_idx ON machines (org_id, lower(asset_tag) text_pattern_ops);
CREATE INDEX reservations_order_ref_prefix_idx ON reservations (org_id, lower(order_ref) text_pattern_ops);
