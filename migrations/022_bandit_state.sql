-- The decider's bandit (services/decider/bandit): its learned model, one row per decision point.
-- Written by the leading decider only, fenced like its decisions: a write carrying an older lease
-- token than the row's is refused, so a replaced leader cannot overwrite what its successor
-- learned. `adc bandit reset` (the api, admins) only asks: it sets reset_requested_at, and the
-- leading decider resets the model at its next write and audits it.
CREATE TABLE bandit_state (
    point              text PRIMARY KEY CHECK (point ~ '^[a-z_]{1,32}$'),
    version            bigint NOT NULL CHECK (version >= 0),
    model              bytea NOT NULL,
    fence              bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
    stats              jsonb NOT NULL DEFAULT '{}',
    writer             text,
    updated_at         timestamptz NOT NULL DEFAULT now(),
    reset_requested_at timestamptz,
    reset_requested_by text
);
