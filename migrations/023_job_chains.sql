-- A chained submission (services/api/job_chains.py) stores the chain's id (its first job's) in the spec;
-- a job's page lists the jobs of its chain.
CREATE INDEX jobs_chain_idx ON jobs ((spec->>'chain')) WHERE spec ? 'chain';
