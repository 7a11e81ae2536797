-- Who is calling the API, read in the same statement as the decision it
-- guards: the token (its SHA-256), its scope, and R12's two switches of the
-- datacenter module. Called by api_reserve (allocator.sql) and
-- api_transition (transitions.sql).

-- The caller of an API request, from its bearer token's SHA-256: 'ok' with
-- the organization and the token's name, or why not, in the order the API
-- checks ('unauthorized': unknown or revoked; 'forbidden': lacks p_scope;
-- 'module_off_deployment' / 'module_off_org': R12's two switches).
-- Read in the same statement as the decision it guards, so a revoked token
-- is refused from the very next request, with no round trip of its own.
CREATE OR REPLACE FUNCTION api_caller(p_token_hash bytea, p_scope text, p_module_on boolean,
                                      OUT status text, OUT org_id bigint, OUT actor text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_scopes text[];
    v_enabled boolean;
BEGIN
    SELECT t.org_id, t.name, t.scopes, o.datacenter_enabled
      INTO org_id, actor, v_scopes, v_enabled
      FROM api_tokens t JOIN organizations o ON o.id = t.org_id
     WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL;
    status := CASE WHEN NOT FOUND THEN 'unauthorized'
                   WHEN NOT (p_scope = ANY (v_scopes)) THEN 'forbidden'
                   WHEN NOT p_module_on THEN 'module_off_deployment'
                   WHEN NOT v_enabled THEN 'module_off_org'
                   ELSE 'ok' END;
END
$$;
