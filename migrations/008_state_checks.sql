-- The state machines' values and edges, held by the database too (shared/job_status.py,
-- shared/node_status.py, shared/protocol_steps.py are the source; tests/unit/test_state_tables.py
-- checks that this file says the same).

ALTER TABLE jobs ADD CONSTRAINT jobs_status_known CHECK (status IN (
    'pending', 'scheduled', 'starting', 'running', 'checkpointing', 'migrating', 'preempted', 'resizing',
    'paused', 'succeeded', 'failed', 'cancelled'));
-- A job that holds devices says which; a waiting one holds none.
ALTER TABLE jobs ADD CONSTRAINT jobs_placed_when_holding CHECK (
    status NOT IN ('scheduled', 'starting', 'running', 'checkpointing', 'migrating', 'resizing')
    OR placement IS NOT NULL);
ALTER TABLE jobs ADD CONSTRAINT jobs_unplaced_when_waiting CHECK (
    status NOT IN ('pending', 'preempted', 'paused') OR placement IS NULL);
ALTER TABLE jobs ADD CONSTRAINT jobs_attempt_counts CHECK (attempt >= 0);

-- Train settings the executor gives later starts (an OOM retry's smaller micro-batch), and how
-- the last attempt ended (shared/outcomes.py).
ALTER TABLE jobs ADD COLUMN train_overrides jsonb NOT NULL DEFAULT '{}';
ALTER TABLE jobs ADD COLUMN last_outcome text
    CHECK (last_outcome IN ('succeeded', 'stopped', 'oom', 'failed', 'cancelled', 'killed'));
ALTER TABLE jobs ADD COLUMN oom_retries integer NOT NULL DEFAULT 0 CHECK (oom_retries >= 0);

ALTER TABLE job_status_history ADD CONSTRAINT job_status_history_edge CHECK (
    (old_status IS NULL AND new_status = 'pending')
    OR old_status || '>' || new_status IN (
        'checkpointing>cancelled', 'checkpointing>failed', 'checkpointing>migrating', 'checkpointing>paused',
        'checkpointing>pending', 'checkpointing>preempted', 'checkpointing>resizing', 'checkpointing>succeeded',
        'migrating>cancelled', 'migrating>failed', 'migrating>migrating', 'migrating>pending', 'migrating>starting',
        'paused>cancelled', 'paused>pending', 'pending>cancelled', 'pending>scheduled', 'preempted>cancelled',
        'preempted>pending', 'resizing>cancelled', 'resizing>failed', 'resizing>migrating', 'resizing>pending',
        'resizing>starting', 'running>cancelled', 'running>checkpointing', 'running>failed', 'running>pending',
        'running>succeeded', 'scheduled>cancelled', 'scheduled>failed', 'scheduled>pending', 'scheduled>starting',
        'starting>cancelled', 'starting>failed', 'starting>pending', 'starting>running', 'starting>succeeded'));

-- A submitted job's first history row is the database's, not the api's: the api records the
-- request (the row, status defaulting to pending), the executor every change after it.
CREATE FUNCTION jobs_submitted_history() RETURNS trigger AS $$
BEGIN
    IF NEW.status = 'pending' THEN
        INSERT INTO job_status_history (job_id, old_status, new_status, reason) VALUES (NEW.id, NULL, 'pending', 'submitted');
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER jobs_submitted_history AFTER INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION jobs_submitted_history();

ALTER TABLE decisions ADD CONSTRAINT decisions_state_known CHECK (state IN ('received', 'done', 'refused', 'failed'));

ALTER TABLE protocols ADD CONSTRAINT protocols_kind_known CHECK (kind IN ('migrate', 'tune', 'scale', 'preempt', 'pause'));
ALTER TABLE protocols ADD CONSTRAINT protocols_step_known CHECK (
    step IN ('stopping', 'hold', 'placing', 'starting_target', 'rollback'));
