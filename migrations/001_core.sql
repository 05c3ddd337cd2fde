-- Jobs, their status history, nodes, the executor's decision ledger, API tokens.

CREATE TABLE jobs (
    id                   text PRIMARY KEY,
    name                 text NOT NULL,
    owner                text NOT NULL,
    team                 text NOT NULL,
    priority             text NOT NULL,
    priority_rank        integer NOT NULL,          -- 0 = highest, from the config's level order
    gpus                 integer NOT NULL CHECK (gpus >= 0),
    preemptible          boolean NOT NULL,
    spec                 jsonb NOT NULL,            -- the whole accepted spec, train section validated
    status               text NOT NULL DEFAULT 'pending',
    status_reason        text,
    placement            jsonb,                     -- [{node, gpus}], written by the executor only
    attempt              integer NOT NULL DEFAULT 0,
    resume_from          text,
    last_checkpoint      text,
    last_checkpoint_step integer,
    progress             jsonb,
    job_dir              text,
    exit_code            integer,
    cancel_requested     boolean NOT NULL DEFAULT false,
    submitted_at         timestamptz NOT NULL DEFAULT now(),
    started_at           timestamptz,
    finished_at          timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_status_idx ON jobs (status);
CREATE INDEX jobs_team_submitted_idx ON jobs (team, submitted_at DESC);

CREATE TABLE job_status_history (
    id          bigserial PRIMARY KEY,
    job_id      text NOT NULL REFERENCES jobs (id),
    old_status  text,
    new_status  text NOT NULL,
    decision_id text,
    reason      text,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_status_history_job_idx ON job_status_history (job_id, id);

CREATE TABLE nodes (
    id             text PRIMARY KEY,
    status         text NOT NULL DEFAULT 'ready',
    devices        jsonb NOT NULL,
    rack           text NOT NULL DEFAULT '',
    started_at     timestamptz,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    last_heartbeat timestamptz NOT NULL DEFAULT now()
);

-- The executor records each decision it receives, so a redelivered one is not acted on twice.
CREATE TABLE decisions (
    decision_id text PRIMARY KEY,
    job_id      text NOT NULL,
    rule        text NOT NULL,
    action      text NOT NULL,
    payload     jsonb NOT NULL,
    state       text NOT NULL,            -- received | done | refused | failed
    outcome     text,
    received_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX decisions_job_idx ON decisions (job_id);

CREATE TABLE api_tokens (
    id          text PRIMARY KEY,
    token_hash  text NOT NULL UNIQUE,    -- sha256 of the secret; the secret itself is never stored
    name        text NOT NULL,
    role        text NOT NULL CHECK (role IN ('user', 'operator', 'admin')),
    team        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_at  timestamptz
);
