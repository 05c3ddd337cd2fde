-- leader_fences (017) came after the roles (015): the executor's ledger records and reads the newest
-- token of each leading role there, so its role needs the table (the decider does not touch it).
GRANT SELECT, INSERT, UPDATE ON leader_fences TO adc_executor;
