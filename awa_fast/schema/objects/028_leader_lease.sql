-- Included by migration 028 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
CREATE TABLE awa_fast.leader_lease (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch bigint NOT NULL DEFAULT 0,
    holder text,
    via_lock boolean NOT NULL DEFAULT false,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO awa_fast.leader_lease DEFAULT VALUES;
