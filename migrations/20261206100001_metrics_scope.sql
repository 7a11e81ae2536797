-- The `metrics` scope: a token that reads /metrics on the main listener. It
-- is an operator's credential (the pool gauges name every organization's
-- sites and profiles), so it is never combined with an organization's API
-- scopes: a token of its own, made with `poolkeeper token add`.
ALTER TABLE api_tokens
    DROP CONSTRAINT api_tokens_scopes_known,
    ADD CONSTRAINT api_tokens_scopes_known
        CHECK (scopes <@ ARRAY['orders', 'inventory', 'metrics']::text[]
               AND cardinality(scopes) > 0
               AND (NOT 'metrics' = ANY (scopes) OR cardinality(scopes) = 1));
