/*
 * Settlement with a failure consequence (ADR-PFM-OPS-003 as awa-fast implements it: ADR 004,
 * awa_fast/worker/consequences.py). models/README.md maps every variable and step to the code.
 *
 * One job of a kind with a failure effect (max_attempts = MAXA). Its effect has a database part
 * (written on the settlement connection, committed with the settlement or rolled back with it)
 * and possibly an outside part (an HTTP call ...) that a rollback cannot undo, so every run of
 * the effect counts as an application. Every transaction may crash before its commit.
 *
 * Paths: the worker's failure path (effect, then settle, in one transaction; consequence_pending
 * and owed when the effect fails); rescue (on the final attempt: consequence_pending, owed);
 * the reconciler (applies owed effects, settles); verify_success and correct_to_failed (the
 * verdict and the correction in one transaction; the correction owes the effect); prune, admin
 * retry, cancel and DLQ move.
 *
 * Invariants:
 *   failed_job_has_effect_applied_or_owed  every job that ends failed (or whose apparent success
 *       was found not done) has its effect applied or owed, never neither
 *   nothing_owed_is_lost                   nothing owed is pruned, retried, moved or cancelled
 *   effect_repeats_only_as_repeat          an effect applied more than once is only a repeat:
 *       every run until the application commits carries the same idempotency key, and the
 *       database part commits once per failure
 *
 * Every transaction may crash before COMMIT, including after the outside part of an effect ran.
 * Negative configurations (each expected to FAIL):
 *   NEG_EFFECT_FIRST    the failure path runs the effect before anything durable records the
 *                       failure (the code before this model's fix): a crash after the effect's
 *                       outside part leaves the attempt running; rescue (non-final attempt) or
 *                       an admin cancel + retry sends the job round again and its next failure
 *                       runs the effect under another idempotency key
 *   NEG_VERDICT_FIRST   the verdict (verified_at) commits before the correction, separately
 *   NEG_SETTLE_FIRST    the failure path settles first and runs the effect after, separately
 *   NEG_PRUNE_OWED      prune deletes failed rows whose consequence is still owed
 *   NEG_RETRY_OWED      admin retry of a failed job ignores an owed consequence
 *   NEG_CANCEL_OWED     admin cancel takes a consequence_pending job
 */

#define MAXA 2        /* max_attempts */
#define MAXL 3        /* claims the model explores (run_lease 1..MAXL) */

#define AVAILABLE 1   /* available / retryable (promotion folded in) */
#define RUNNING   2
#define COMPLETED 3
#define FAILED    4
#define PENDING   5   /* consequence_pending */
#define CANCELLED 6
#define GONE      7   /* deleted: pruned, or moved to the DLQ */

#define OWED      1   /* consequence_state */
#define APPLIED   2

byte st = AVAILABLE;
byte lease;           /* run_lease */
byte attempt;
byte cstate;          /* consequence_state: 0 (NULL), OWED, APPLIED */
bool corrected;       /* consequence_reason = 'corrected' (path reconciliation) */
bool verified;        /* verified_at IS NOT NULL */
byte retries = 1;     /* admin retries the model explores */

/* ghosts */
bool work_done;       /* the truth behind an apparent success (what verify_success reports) */
byte open_key;        /* idempotency key of effect runs not yet committed as applied; 0 none */
byte db_applied;      /* database part of the effect committed, this failure */
bool lost;            /* an owed consequence was dropped */

#define FAIL(msg) printf(msg); assert(false)
#define KEY(l, corr) ((l) * 2 + (corr))   /* consequences.idempotency_key(id, run_lease, reason) */

/* ConsequenceApplier.run_effect: the effect runs (its outside part cannot be rolled back) */
inline run_effect(key) {
    if
    :: open_key != 0 && open_key != key ->
        FAIL("INVARIANT VIOLATED: effect_repeats_only_as_repeat\n")
    :: else -> open_key = key
    fi
}

/* the effect's application commits (sql.SETTLE_FAILED / sql.MARK_CONSEQUENCE_APPLIED) */
inline applied_commits() {
    if
    :: db_applied != 0 -> FAIL("INVARIANT VIOLATED: effect_repeats_only_as_repeat\n")
    :: else -> skip
    fi;
    db_applied = 1;
    open_key = 0;
    cstate = APPLIED
}

/* a row leaves the states the reconciler reads (sql.LOCK_OWED) while owed */
inline drop(new_state) {
    if :: cstate == OWED -> lost = 1 :: else -> skip fi;
    st = new_state
}

/* The worker: claims, runs the handler, finalizes (Runtime._run, Finalizer). */
active [2] proctype Worker() {     /* two workers: a rescued attempt can still be running */
    byte l;
end_idle:
    do
    :: atomic { st == AVAILABLE && lease < MAXL -> st = RUNNING; lease++; attempt++; l = lease };
       if
       :: skip                                           /* worker killed: rescue takes over */
       :: atomic {                                       /* Completed: sql.COMPLETE_MANY */
              st == RUNNING && lease == l -> st = COMPLETED; verified = 0;
              if :: work_done = 1 :: work_done = 0 fi
          }
       :: atomic { st == RUNNING && lease == l && attempt < MAXA -> st = AVAILABLE }
                                                         /* retryable error: sql.TRANSITION */
       :: true ->                               /* terminal error, or exhausted (final) */
#if defined(NEG_EFFECT_FIRST)
          /* the failure path before this model's fix: the effect, then the settlement, in ONE
           * transaction, so a crash after the effect's outside part leaves the attempt running */
          atomic {
              if
              :: st == RUNNING && lease == l ->
                  if
                  :: true; run_effect(KEY(l, 0));
                     applied_commits(); st = FAILED; corrected = 0   /* effect ok, settled */
                  :: true; run_effect(KEY(l, 0));
                     st = PENDING; cstate = OWED; corrected = 0      /* effect failed: owed */
                  :: skip                                            /* crashed first */
                  :: true; run_effect(KEY(l, 0))   /* crashed after it, before COMMIT */
                  fi
              :: else -> skip                                        /* stale */
              fi
          }
#elif !defined(NEG_SETTLE_FIRST)
          /* Finalizer._fail_once, kind with an effect: first sql.LOCK_RUNNING (guard) and
           * Settler.owe_failure (sql.APPEND_ERROR, sql.OWE_FAILURE: consequence_pending, owed)
           * in one transaction; then Settler.reconcile_on: the effect and the settlement in the
           * next one (the same step as the reconciler's, which may take it first) */
          atomic {
              if
              :: st == RUNNING && lease == l -> st = PENDING; cstate = OWED; corrected = 0
              :: st == RUNNING && lease == l -> l = 0                /* crashed before COMMIT */
              :: else -> l = 0                                       /* stale */
              fi
          };
          if
          :: atomic {
                 l != 0 && cstate == OWED && st == PENDING ->
                 run_effect(KEY(lease, 0));
                 if
                 :: applied_commits(); st = FAILED                   /* settled */
                 :: skip                             /* effect failed: owed (backoff) */
                 :: skip                             /* crashed after the effect, before COMMIT */
                 fi
             }
          :: skip                                    /* killed, or the reconciler has it */
          fi
#else
          atomic { if :: st == RUNNING && lease == l -> st = FAILED; corrected = 0
                      :: else -> l = 0 fi };                         /* stale */
          if
          :: atomic { l != 0 && st == FAILED && lease == l -> run_effect(KEY(l, 0));
                      if :: applied_commits() :: skip fi }
          :: skip                                                    /* crashed in between */
          fi
#endif
       fi;
       l = 0
    od
}

/* The maintenance leader (its passes are fenced, so they run one at a time: leader_fencing.pml). */
active proctype Leader() {
end_idle:
    do
    /* sql.RESCUE: stale heartbeat / deadline; the final attempt of a kind with a consequence
     * waits in consequence_pending, owed */
    :: atomic { st == RUNNING ->
                if :: attempt < MAXA -> st = AVAILABLE
                   :: else -> st = PENDING; cstate = OWED; corrected = 0 fi }
    /* reconcile_tick -> Settler.reconcile_on: sql.LOCK_OWED, the effect, then sql.SETTLE_FAILED
     * (pending) or sql.MARK_CONSEQUENCE_APPLIED (corrected); one transaction */
    :: atomic {
           cstate == OWED && (st == PENDING || st == FAILED) ->
           run_effect(KEY(lease, corrected));
           if
           :: applied_commits(); st = FAILED
           :: skip                                   /* effect failed: owed, retried later */
           :: skip                                   /* crashed before COMMIT */
           fi
       }
    /* reconcile._verify: sql.LOCK_UNVERIFIED, sql.MARK_VERIFIED and, for "not done",
     * Settler.correct (sql.CORRECT_TO_FAILED: failed, consequence owed) */
#ifndef NEG_VERDICT_FIRST
    :: atomic {
           st == COMPLETED && !verified ->
           if
           :: verified = 1;
              if :: !work_done -> st = FAILED; cstate = OWED; corrected = 1 :: else -> skip fi
           :: skip                                   /* crashed before COMMIT */
           fi
       }
#else
    :: atomic { st == COMPLETED && !verified -> verified = 1 };
       if
       :: atomic { st == COMPLETED && !work_done -> st = FAILED; cstate = OWED; corrected = 1 }
       :: skip                                       /* crashed in between */
       fi
#endif
    /* sql.PRUNE (retention, abstracted: any finished row; completed ones after verification) */
#ifdef NEG_PRUNE_OWED
    :: atomic { (st == FAILED || st == CANCELLED || (st == COMPLETED && verified)) -> drop(GONE) }
#else
    :: atomic { cstate != OWED && (st == FAILED || st == CANCELLED || (st == COMPLETED && verified)) ->
                drop(GONE) }
#endif
    od
}

/* An operator: retry (sql.RETRY_JOB, retry_failed), cancel (sql.CANCEL_JOB), DLQ move. */
active proctype Admin() {
end_idle:
    do
#ifdef NEG_RETRY_OWED
    :: atomic { retries > 0 && (st == FAILED || st == CANCELLED) ->
#else
    :: atomic { retries > 0 && (st == FAILED || st == CANCELLED) && cstate != OWED ->
#endif
                retries--; attempt = 0; drop(AVAILABLE);
                db_applied = 0; cstate = 0; corrected = 0 }   /* a new failure may follow */
#ifdef NEG_CANCEL_OWED
    :: atomic { (st == AVAILABLE || st == RUNNING || st == PENDING) -> drop(CANCELLED) }
#else
    :: atomic { (st == AVAILABLE || st == RUNNING) -> drop(CANCELLED) }
#endif
    :: atomic { st == FAILED && cstate != OWED -> drop(GONE) }      /* sql.DLQ_MOVE_ONE */
    od
}

#define FAILED_OK \
    ((st != FAILED || cstate == OWED || (cstate == APPLIED && db_applied)) && \
     (st != PENDING || cstate == OWED) && \
     !(st == COMPLETED && verified && !work_done))

active proctype Monitor() {
end_monitor:
    do
    :: atomic { !FAILED_OK -> FAIL("INVARIANT VIOLATED: failed_job_has_effect_applied_or_owed\n") }
    :: atomic { lost -> FAIL("INVARIANT VIOLATED: nothing_owed_is_lost\n") }
    od
}
