-- A Postgres role per service, each with only the grants its queries need, and a migration role
-- that owns the tables (so it alone, besides a superuser, can alter or drop the audit triggers:
-- in Postgres only a table's owner may ALTER/DISABLE/DROP its triggers).
--
--   adc_migrate   owns every table; runs later migrations (`adc db migrate`). No service uses it.
--   adc_api       records requests: inserts jobs (only the columns of a submission: never status),
--                 move requests, tokens, quotas, policies; reads what it serves. Never job status.
--   adc_decider   reads; writes nothing in Postgres (its decisions go on the bus).
--   adc_executor  the only writer of job status and its history, nodes, decisions, protocols.
--   adc_audit     the audit sink: the only role that inserts audit rows.
-- The collector and the workers use no database.
--
-- Roles are cluster-wide while the grants are per database, and tests create databases in
-- parallel: each role is created only if missing, and losing a race to create it is fine.
-- Services log in as these roles without a password where pg_hba trusts local connections (the
-- local stack); in production give each a password (ALTER ROLE adc_api PASSWORD ...) or a client
-- certificate, and each service only its own (README, "Security model").
--
-- A later migration that adds a table, or a column the api inserts, grants what each role needs the same way.

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['adc_migrate', 'adc_api', 'adc_decider', 'adc_executor', 'adc_audit'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN NOINHERIT', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration created it a moment ago
            END;
        END IF;
    END LOOP;
END
$$;

GRANT USAGE, CREATE ON SCHEMA public TO adc_migrate;

-- The migration role owns the tables, sequences and trigger functions; no service owns anything.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' LOOP
        EXECUTE format('ALTER TABLE public.%I OWNER TO adc_migrate', t.tablename);
    END LOOP;
END
$$;
ALTER FUNCTION audit_events_append_only() OWNER TO adc_migrate;
ALTER FUNCTION audit_events_notify() OWNER TO adc_migrate;
ALTER FUNCTION jobs_submitted_history() OWNER TO adc_migrate;

-- A submitted job's first history row is the database's (008): the trigger writes it with its
-- owner's rights, so the api needs no right on job_status_history.
ALTER FUNCTION jobs_submitted_history() SECURITY DEFINER SET search_path = public, pg_temp;

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM PUBLIC;

-- api
GRANT SELECT ON jobs, nodes, decisions, protocols, audit_events, api_tokens, quotas, policies, controller_state,
    move_requests TO adc_api;
GRANT INSERT (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec, trace_parent) ON jobs TO adc_api;
GRANT INSERT ON move_requests, api_tokens, quotas, policies TO adc_api;
GRANT UPDATE (revoked_at) ON api_tokens TO adc_api;
GRANT UPDATE, DELETE ON quotas TO adc_api;
GRANT UPDATE (paused, reason, updated_by, updated_at) ON controller_state TO adc_api;
GRANT USAGE ON SEQUENCE policies_version_seq TO adc_api;

-- decider
GRANT SELECT ON jobs, nodes, decisions, quotas, policies, controller_state, move_requests TO adc_decider;

-- executor
GRANT SELECT, UPDATE ON jobs TO adc_executor;
GRANT SELECT, INSERT ON job_status_history TO adc_executor;
GRANT SELECT, INSERT, UPDATE ON nodes, decisions, protocols TO adc_executor;
GRANT USAGE ON SEQUENCE job_status_history_id_seq TO adc_executor;

-- audit sink
GRANT SELECT, INSERT ON audit_events TO adc_audit;
GRANT USAGE ON SEQUENCE audit_events_id_seq TO adc_audit;
