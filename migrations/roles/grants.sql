-- Who may do what, per service role (the roles: 015_roles.sql). Applied by `migrate` after every
-- run, so it always covers every table: a migration that adds a table (or a column the api
-- inserts) adds its line here. Each statement is idempotent.
--
--   adc_migrate   owns every table and the trigger functions; runs later migrations. No service uses it.
--   adc_api       records requests: inserts jobs (only the columns of a submission: never status),
--                 move requests, tokens, quotas, policies; reads what it serves. Never job status.
--   adc_decider   reads; writes only its bandit's learned model (its decisions go on the bus).
--   adc_executor  the only writer of job state and its history, nodes, decisions, protocols, fences.
--   adc_audit     the audit sink: the only role that inserts audit rows.

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
ALTER FUNCTION jobs_attempt_nodes() OWNER TO adc_migrate;  -- 020
ALTER FUNCTION api_tokens_notify() OWNER TO adc_migrate;  -- 025

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM PUBLIC;

-- api
GRANT SELECT ON jobs, nodes, decisions, protocols, audit_events, api_tokens, quotas, policies, controller_state,
    move_requests, job_attempt_nodes TO adc_api;
GRANT INSERT (id, name, owner, team, priority, priority_rank, gpus, preemptible, spec, trace_parent) ON jobs TO adc_api;
GRANT INSERT ON move_requests, api_tokens, quotas, policies TO adc_api;
GRANT UPDATE (revoked_at) ON api_tokens TO adc_api;
GRANT UPDATE, DELETE ON quotas TO adc_api;
GRANT UPDATE (paused, reason, updated_by, updated_at) ON controller_state TO adc_api;
GRANT USAGE ON SEQUENCE policies_version_seq TO adc_api;
GRANT SELECT ON bandit_state TO adc_api;
GRANT UPDATE (reset_requested_at, reset_requested_by) ON bandit_state TO adc_api;  -- asks for a reset (022)

-- decider
GRANT SELECT ON jobs, nodes, decisions, quotas, policies, controller_state, move_requests TO adc_decider;
GRANT SELECT, INSERT, UPDATE ON bandit_state TO adc_decider;  -- its learned model, fenced (022)

-- executor
GRANT SELECT, UPDATE ON jobs TO adc_executor;
GRANT SELECT, INSERT ON job_status_history TO adc_executor;
GRANT SELECT ON job_attempt_nodes TO adc_executor;  -- written by the jobs trigger (020)
GRANT SELECT, INSERT, UPDATE ON nodes, decisions, protocols TO adc_executor;
GRANT USAGE ON SEQUENCE job_status_history_id_seq TO adc_executor;
GRANT SELECT, INSERT, UPDATE ON leader_fences TO adc_executor;  -- the leases' fencing tokens (017)

-- audit sink
GRANT SELECT, INSERT ON audit_events TO adc_audit;
GRANT SELECT (id, team) ON jobs TO adc_audit;  -- the team of a row's job (026)
GRANT USAGE ON SEQUENCE audit_events_id_seq TO adc_audit;
