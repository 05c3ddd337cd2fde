-- The newest lease token (shared/leases.py) each leading role has shown. The executor's ledger
-- refuses a decision whose decider token is older than the decider's row, and an executor whose
-- own token is older than the executor's row has been replaced and steps down.
CREATE TABLE leader_fences (
    role       text PRIMARY KEY CHECK (role IN ('decider', 'executor')),
    token      bigint NOT NULL CHECK (token > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX decisions_received_idx ON decisions (received_at) WHERE state = 'received';
-- Only the executor reads and raises the fences (roles of 015_roles.sql).
GRANT SELECT, INSERT, UPDATE ON leader_fences TO adc_executor;
