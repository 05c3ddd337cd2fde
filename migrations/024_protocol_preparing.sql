-- A move's first step: the target's trainer made ready (a warm trainer) before the source stops.
ALTER TABLE protocols DROP CONSTRAINT protocols_step_known;
ALTER TABLE protocols ADD CONSTRAINT protocols_step_known CHECK (
    step IN ('preparing', 'stopping', 'hold', 'placing', 'starting_target', 'rollback'));
