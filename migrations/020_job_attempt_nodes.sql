-- The nodes each attempt of a job was placed on, so a reader of the job's events (the api's metrics
-- and event history, read from the bus) takes a trainer's event only from a node of its attempt's
-- placement, also for attempts long past. Kept by a trigger on jobs: the statement that places a
-- job (the executor's) records it, so no writer can forget it. An attempt's placement may change
-- while it lasts (a protocol's rollback): every node it was ever given counts.
CREATE TABLE job_attempt_nodes (
    job_id  text NOT NULL REFERENCES jobs (id),
    attempt integer NOT NULL,
    nodes   text[] NOT NULL,
    PRIMARY KEY (job_id, attempt)
);

CREATE FUNCTION jobs_attempt_nodes() RETURNS trigger AS $$
BEGIN
    IF jsonb_typeof(NEW.placement) = 'array' AND jsonb_array_length(NEW.placement) > 0 THEN
        INSERT INTO job_attempt_nodes (job_id, attempt, nodes)
        SELECT NEW.id, NEW.attempt, array_agg(DISTINCT p->>'node') FROM jsonb_array_elements(NEW.placement) p
        ON CONFLICT (job_id, attempt) DO UPDATE
            SET nodes = ARRAY(SELECT DISTINCT unnest(job_attempt_nodes.nodes || EXCLUDED.nodes) ORDER BY 1);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp;  -- the executor needs no grant on the table
CREATE TRIGGER jobs_attempt_nodes AFTER INSERT OR UPDATE OF placement, attempt ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_attempt_nodes();

-- The jobs placed before this table existed: their current attempt.
INSERT INTO job_attempt_nodes (job_id, attempt, nodes)
SELECT j.id, j.attempt, array_agg(DISTINCT p->>'node')
FROM jobs j, jsonb_array_elements(j.placement) p
WHERE jsonb_typeof(j.placement) = 'array'
GROUP BY j.id, j.attempt
ON CONFLICT DO NOTHING;
