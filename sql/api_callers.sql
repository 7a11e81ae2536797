-- Who is calling the API, read in the same statement as the decision it
-- guards: the token (its SHA-256), its scope, and R12's two switches of the
-- datacenter module. Called by api_reserve_order (allocator.sql),
-- api_transition and api_order_transition (transitions.sql).

-- The caller of an API request, from its bearer token's SHA-256: 'ok' with
-- the organization and the token's name, or why not, in the order the API
-- checks ('unauthorized': unknown or revoked; 'forbidden': lacks p_scope;
-- 'module_off_deployment' / 'module_off_org': R12's two switches).
-- Read in the same statement as the decision it guards, so a revoked token
-- is refused from the very next request, with no round trip of its own.
--
-- A SQL function of one SELECT, STABLE and returning a set: PostgreSQL
-- inlines it into the statement of its caller, so the token is read by
-- that statement itself, without a PL/pgSQL call and a statement of its
-- own (per request, 19 µs as PL/pgSQL, 7 µs inlined: BENCHMARKS.md). It
-- always answers one row. Dropped first: CREATE OR REPLACE cannot change a
-- function's return type, and the PL/pgSQL form had OUT parameters.
DROP FUNCTION IF EXISTS api_caller(bytea, text, boolean);
CREATE FUNCTION api_caller(p_token_hash bytea, p_scope text, p_module_on boolean)
RETURNS TABLE (status text, org_id bigint, actor text)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN c.org_id IS NULL THEN 'unauthorized'
                WHEN NOT (p_scope = ANY (c.scopes)) THEN 'forbidden'
                WHEN NOT p_module_on THEN 'module_off_deployment'
                WHEN NOT c.datacenter_enabled THEN 'module_off_org'
                ELSE 'ok' END,
           c.org_id, c.name
      FROM (SELECT 1) one
      LEFT JOIN (SELECT t.org_id, t.name, t.scopes, o.datacenter_enabled
                   FROM api_tokens t JOIN organizations o ON o.id = t.org_id
                  WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL) c ON true
$$;
