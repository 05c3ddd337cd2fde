-- A Postgres role per service and a migration role. What each may do (the grants) and who owns
-- the tables (the migration role: in Postgres only a table's owner may ALTER/DISABLE/DROP its
-- triggers, so it alone, besides a superuser, can touch the audit triggers) are in
-- migrations/roles/grants.sql, which `migrate` applies again after every run, so a table a later
-- migration adds is granted there in one place.
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

-- A submitted job's first history row is the database's (008): the trigger writes it with its
-- owner's rights, so the api needs no right on job_status_history.
ALTER FUNCTION jobs_submitted_history() SECURITY DEFINER SET search_path = public, pg_temp;
