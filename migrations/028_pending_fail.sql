-- A pending job may be failed: the decider gives up on one that ran out of memory again with its
-- retries spent (strategies.oom_retry.max_retries), so the edge pending > failed joins the table
-- (shared/contracts/job_status.py is the source; tests/unit/test_state_tables.py checks this copy).

ALTER TABLE job_status_history DROP CONSTRAINT job_status_history_edge;
ALTER TABLE job_status_history ADD CONSTRAINT job_status_history_edge CHECK (
    (old_status IS NULL AND new_status = 'pending')
    OR old_status || '>' || new_status IN (
        'checkpointing>cancelled', 'checkpointing>failed', 'checkpointing>migrating', 'checkpointing>paused',
        'checkpointing>pending', 'checkpointing>preempted', 'checkpointing>resizing',
        'checkpointing>succeeded', 'migrating>cancelled', 'migrating>failed', 'migrating>migrating',
        'migrating>pending', 'migrating>starting', 'paused>cancelled', 'paused>pending', 'pending>cancelled',
        'pending>failed', 'pending>scheduled', 'preempted>cancelled', 'preempted>pending',
        'resizing>cancelled', 'resizing>failed', 'resizing>migrating', 'resizing>pending',
        'resizing>starting', 'running>cancelled', 'running>checkpointing', 'running>failed',
        'running>pending', 'running>succeeded', 'scheduled>cancelled', 'scheduled>failed',
        'scheduled>pending', 'scheduled>starting', 'starting>cancelled', 'starting>failed',
        'starting>pending', 'starting>running', 'starting>succeeded'));
