-- Protocols the executor is carrying out (migrate, preempt, scale, tune, pause, drain), with
-- their current step, so a restarted executor resumes them instead of starting over.

CREATE TABLE protocols (
    id          text PRIMARY KEY,           -- the decision id
    job_id      text NOT NULL,              -- a job id, or node:<id> for node protocols
    kind        text NOT NULL,
    step        text NOT NULL,
    state       text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed', 'rolled_back')),
    source      jsonb,                      -- placement before
    target      jsonb,                      -- placement asked for
    checkpoint  text,
    ckpt_step   integer,
    detail      jsonb NOT NULL DEFAULT '{}',
    error       text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
-- At most one protocol per job at a time.
CREATE UNIQUE INDEX protocols_one_running_per_job ON protocols (job_id) WHERE state = 'running';

ALTER TABLE nodes ADD COLUMN address text NOT NULL DEFAULT '127.0.0.1';  -- where rank 0 of a multi-node job listens
ALTER TABLE nodes ADD CONSTRAINT nodes_status_known CHECK (status IN ('ready', 'cordoned', 'draining', 'lost'));
