-- The audit log: append-only, each row chained to the previous one by hash.

CREATE TABLE audit_events (
    id          bigserial PRIMARY KEY,
    event_id    text NOT NULL UNIQUE,
    ts          timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    source      text NOT NULL,
    kind        text NOT NULL,
    actor       text,
    job_id      text,
    node        text,
    decision_id text,
    rule        text,
    action      text,
    reason      text,
    evidence    jsonb NOT NULL DEFAULT '{}',
    data        jsonb NOT NULL DEFAULT '{}',
    prev_hash   text NOT NULL,
    hash        text NOT NULL
);
CREATE INDEX audit_events_ts_idx ON audit_events (ts);
CREATE INDEX audit_events_job_idx ON audit_events (job_id, id);
CREATE INDEX audit_events_kind_idx ON audit_events (kind, id);
CREATE INDEX audit_events_rule_idx ON audit_events (rule, id) WHERE rule IS NOT NULL;
CREATE INDEX audit_events_actor_idx ON audit_events (actor, id) WHERE actor IS NOT NULL;
CREATE INDEX audit_events_node_idx ON audit_events (node, id) WHERE node IS NOT NULL;

CREATE FUNCTION audit_events_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER audit_events_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();

CREATE TRIGGER audit_events_no_truncate
    BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only();
