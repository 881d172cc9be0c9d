-- Included by migration 012 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
CREATE OR REPLACE FUNCTION awa_fast.done_slot(s awa_fast.job_state, at timestamptz)
RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (CASE WHEN s = 'completed'
                 THEN mod(mod(floor(extract(epoch FROM at - timestamptz 'epoch') / 3600)::bigint,
                              32) + 32, 32)
                 ELSE 32 + mod(mod(floor(extract(epoch FROM at - timestamptz 'epoch')
                                         / 10800)::bigint, 32) + 32, 32)
            END)::smallint
$$;
