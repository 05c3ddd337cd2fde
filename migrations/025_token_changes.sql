-- Every change to a token (created, revoked, expiry changed, deleted) wakes the api processes, which
-- cache token rows for a few seconds (services/api/auth.py): each empties its cache at the
-- notification, so a revocation holds at once in every process, whoever wrote it (the api, the CLI,
-- SQL). The payload is empty: a listener re-reads what it needs.
CREATE FUNCTION api_tokens_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('adc_api_tokens_changed', '');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER api_tokens_notify_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON api_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION api_tokens_notify();
