-- Operators' requests to move a job (`adc migrate JOB [--to NODE]`). The api records them; the
-- decider's `drain` rule turns each into a complete decision (it chooses the devices), which
-- names the request in its evidence; a request with such a decision is answered.
CREATE TABLE move_requests (
    id           text PRIMARY KEY,
    job_id       text NOT NULL REFERENCES jobs (id),
    target_node  text,                         -- NULL: any other node with room
    actor        text NOT NULL,
    reason       text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX move_requests_requested_idx ON move_requests (requested_at);
CREATE INDEX decisions_request_idx ON decisions ((payload->'action'->'evidence'->>'request_id'));
