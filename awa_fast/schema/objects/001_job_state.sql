-- Included by migration 001 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
CREATE TYPE awa_fast.job_state AS ENUM (
    'scheduled', 'available', 'running', 'completed', 'retryable',
    'failed', 'cancelled', 'waiting_external', 'consequence_pending'
);

-- Bit position of a state in a unique_states mask (awa's positions; consequence_pending is not
-- settled yet, so it holds the key like running).
CREATE FUNCTION awa_fast.state_bit(s awa_fast.job_state) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE s
        WHEN 'scheduled' THEN 0 WHEN 'available' THEN 1 WHEN 'running' THEN 2
        WHEN 'completed' THEN 3 WHEN 'retryable' THEN 4 WHEN 'failed' THEN 5
        WHEN 'cancelled' THEN 6 WHEN 'waiting_external' THEN 7
        WHEN 'consequence_pending' THEN 2 END
$$;
