-- The controller pause flag operators set through the API, and the wake-up the live audit tail
-- listens for.

-- One row: whether the decider may issue new decisions. The decider reads it each pass;
-- the api publishes controller.paused / controller.resumed audit events when it changes.
CREATE TABLE controller_state (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    paused      boolean NOT NULL DEFAULT false,
    reason      text,
    updated_by  text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO controller_state (id) VALUES (true);

-- One notification per inserting statement (same channel and payload collapse within a
-- transaction), so a bulk load does not queue a million of them. Listeners re-read by id.
CREATE FUNCTION audit_events_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('adc_audit_appended', '');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER audit_events_notify_appended
    AFTER INSERT ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_notify();

-- Job lists filtered by owner (a user's own jobs) stay index-backed.
CREATE INDEX jobs_owner_submitted_idx ON jobs (owner, submitted_at DESC);
