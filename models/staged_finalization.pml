/*
 * Staged finalization: ADR-046 as awa-fast implements it (ADR 003: the completion and its
 * follow-up inserts are ONE statement; ADR 007: the opt-in batched form with its per-job
 * fallback). models/README.md maps every variable and step to the code and the SQL.
 *
 * NJ stage-A jobs. Each claim bumps run_lease (1..NL) and starts that lease's attempt, whose
 * handler stages a nondeterministic key (1..NK) or nothing (0). Follow-ups are stage-B rows,
 * deduplicated by key: a row holds its key while it is in its unique mask's states ("live");
 * the environment may move any holder out of the mask at any time, releasing the key.
 *
 * Configurations (-D...):
 *   (none)                per-job completions (the default start option)
 *   BATCHED               start(staged_completions="batched"); to keep the state space small
 *                         this configuration leaves out what the batch does not change and the
 *                         default configuration checks: callbacks, external completion, outcomes
 *                         other than Completed, and staging nothing
 * Negative configurations, each expected to FAIL with the invariant named in tests/structure/test_models.py:
 *   NEG_FOLLOWUPS_BEFORE  the follow-up is inserted in its own transaction before the completion
 *   NEG_FOLLOWUPS_AFTER   the completion commits, then the follow-up in a separate transaction
 *   NEG_NO_LEASE_GUARD    the completion is guarded by state = 'running' only
 *   NEG_DRAIN_ON_FIRST    the first finalize try drains the sealed follow-ups (a retry has none)
 *   NEG_COMPACT_PATH      a staging job completes through the compact path (inserts nothing)
 *   NEG_BATCH_BY_ID       (with BATCHED) the batch statement matches follow-ups to triggers by
 *                         job id only, not (id, run_lease): the bug fixed in b7e5384
 */

#ifndef NJ
#define NJ 2          /* stage-A jobs */
#endif
#define NL 2          /* claims per job: run_lease 1..NL (max_attempts = NL) */
#define NK 2          /* keys a handler can stage: 1..NK (0 = staged nothing) */
#define MAXR 1        /* finalize retries after the first try (the code: 3) */
#define NR 4          /* follow-up row slots */
#define NB 4          /* batched finalizer buffer slots (= NJ*NL) */

/* job states (awa_fast.job_state) */
#define AVAILABLE 1   /* available, or retryable / scheduled and due (promotion folded in) */
#define RUNNING   2
#define WAITING   3   /* waiting_external */
#define COMPLETED 4
#define FAILED    5

byte st[NJ];
byte lease[NJ];                     /* run_lease */

/* ghosts */
byte done_lease[NJ];                /* lease of the handler completion that committed; 0 = none */
bool done_held[NJ];                 /* right after that commit a live row held the staged key */
bool done_ext[NJ];                  /* completed by complete_external */

/* stage-B rows */
byte fu_trig[NR];                   /* the trigger's job (provenance awa:triggered_by) */
byte fu_lease[NR];                  /* the run_lease of the attempt whose buffer it came from */
byte fu_key[NR];
bool fu_live[NR];                   /* in its unique mask's states: holds its key */
byte nrows;

/* the finalizer's batched buffer */
byte bj[NB];
byte bl[NB];
byte bk[NB];
byte nb;

/* scratch used only inside atomic steps (never live across steps, so not part of the state) */
hidden byte i, c, r, carried;
hidden byte held;
hidden byte donef[NB], donej[NJ];

#define FAIL(msg) printf(msg); assert(false)

#ifdef NEG_NO_LEASE_GUARD
#define GUARD(j, l) (st[j] == RUNNING)
#else
#define GUARD(j, l) (st[j] == RUNNING && lease[j] == l)
#endif
#define LEASE_GUARD(j, l) (st[j] == RUNNING && lease[j] == l)

/* Steps below are written without d_step: each caller runs them inside one atomic step (one
 * SQL statement, or an attempt's local work followed by one statement). */

/* is key k held by a live row? (the dedup index idx_awa_fast_jobs_unique) */
inline key_held(k) {
    held = false;
    i = 0;
    do
    :: i < nrows -> if :: fu_live[i] && fu_key[i] == k -> held = true :: else -> skip fi; i++
    :: else -> break
    od;
    i = 0
}

/* INSERT ... ON CONFLICT (dedup index) DO NOTHING */
inline insert_fu(j, l, k) {
    key_held(k);
    if
    :: !held -> assert(nrows < NR);
                fu_trig[nrows] = j; fu_lease[nrows] = l; fu_key[nrows] = k; fu_live[nrows] = 1;
                nrows++
    :: else -> skip
    fi
}

/* every committed handler completion: the lease invariant, then the row change */
inline record_completion(j, l) {
    if
    :: lease[j] != l -> FAIL("INVARIANT VIOLATED: only_current_lease_completes\n")
    :: else -> skip
    fi;
    st[j] = COMPLETED;
    done_lease[j] = l
}

/* ghost, at the end of the committing statement: the staged key sk has a live holder */
inline record_held(j, sk) {
    if
    :: sk == 0 -> done_held[j] = true
    :: else -> key_held(sk); done_held[j] = held
    fi
}

/* sql.COMPLETE_WITH_FOLLOW_UPS: guarded UPDATE, then the inserts fk iff it matched. */
inline complete_with_follow_ups(j, l, sk, fk) {
    if
    :: GUARD(j, l) ->
        record_completion(j, l);
        if :: fk != 0 -> insert_fu(j, l, fk) :: else -> skip fi;
        record_held(j, sk);
        applied = 1
    :: else -> skip
    fi
}

/* sql.COMPLETE_MANY for one job (the compact path: inserts nothing) */
inline complete_compact(j, l, sk) {
    if
    :: GUARD(j, l) -> record_completion(j, l); record_held(j, sk)
    :: else -> skip
    fi
}

/* Finalizer._finalize_requests: the per-job statement, retried on deadlock / lost connection
 * with the same sealed follow-ups (requests_for builds them once); a lost acknowledgement
 * replays as stale. A try that rolled back changes nothing, so the tries form one step.
 * sk: what the attempt staged; fk: the follow-ups the first try carries. */
inline finalize_per_job(j, l, sk, fk) {
    r = 0;
    carried = fk;
    do
    :: r > MAXR ->                  /* gave up: Finalizer.fail_promptly records a lease-guarded
                                     * failure without inserts (or, if that fails too, the
                                     * attempt stays running until rescue) */
        if
        :: LEASE_GUARD(j, l) -> if :: lease[j] < NL -> st[j] = AVAILABLE :: else -> st[j] = FAILED fi
        :: true
        fi;
        break
    :: else ->
        if
        :: true; complete_with_follow_ups(j, l, sk, carried); break     /* committed, acked */
        :: true; complete_with_follow_ups(j, l, sk, carried); r++       /* committed, ack lost */
        :: r++                                                           /* rolled back */
        fi;
#ifdef NEG_DRAIN_ON_FIRST
        carried = 0                 /* drained by the first try */
#else
        skip
#endif
    od;
    r = 0;
    carried = 0
}

/* The handler returned (Runtime._run maps the outcome and picks the finalization path). */
inline outcome(j, l, k) {
    if
    :: skip                                                     /* worker killed */
#ifndef BATCHED
    :: /* RetryAfter / Cancel / an error / returns WaitForCallback: one guarded transition
        * (sql.TRANSITION, to retryable here); staged follow-ups discarded */
        true;
        if :: LEASE_GUARD(j, l) -> st[j] = AVAILABLE :: else -> skip fi
#endif
    :: k == 0 -> complete_compact(j, l, 0)                       /* staged nothing: compact */
    :: k != 0 ->
#if defined(NEG_FOLLOWUPS_BEFORE)
        insert_fu(j, l, k);                           /* its own transaction, then ... */
        second = 1
#elif defined(NEG_FOLLOWUPS_AFTER)
        finalize_per_job(j, l, k, 0);                 /* the completion, then ... */
        second = 1
#elif defined(NEG_COMPACT_PATH)
        complete_compact(j, l, k)
#elif defined(BATCHED)
        assert(nb < NB); bj[nb] = j; bl[nb] = l; bk[nb] = k; nb++   /* complete_with_follow_ups */
#else
        finalize_per_job(j, l, k, k)                             /* Finalizer.finalize */
#endif
    fi
}

/* The attempt of job j under run_lease l: it starts once a claim gave the job lease l, stages,
 * may wait for a callback inside its handler, returns an outcome, and is finalized. */
proctype Attempt(byte j; byte l) {
    byte k;
    bool applied, second;

end_idle:
    atomic {
        lease[j] >= l ->
        /* the handler stages a key (or nothing); the buffer is sealed when it returns */
#ifdef BATCHED
        if :: k = 1 :: k = 2 fi;        /* (staging nothing is checked in the per-job config) */
#else
        if :: k = 0 :: k = 1 :: k = 2 fi;
#endif
        if
        :: true; outcome(j, l, k)
#ifndef BATCHED
        :: /* ctx.wait_for_callback() inside the handler (sql.REGISTER_CALLBACK,
            * sql.PARK_FOR_CALLBACK): the handler and its buffer stay alive until the row leaves
            * waiting_external for this lease (resumed, timed out, completed externally) */
            true;
            if :: LEASE_GUARD(j, l) -> st[j] = WAITING :: else -> skip fi;
            goto waiting
#endif
        fi
    };
    goto after;
waiting:
end_wait:
    !(st[j] == WAITING && lease[j] == l);
    atomic { outcome(j, l, k) };
after:
    if
    :: second ->
        atomic {
#if defined(NEG_FOLLOWUPS_BEFORE)
            finalize_per_job(j, l, k, 0)              /* ... the completion */
#elif defined(NEG_FOLLOWUPS_AFTER)
            if
            :: applied -> insert_fu(j, l, k)          /* ... the follow-up */
            :: skip                                   /* crashed in between */
            fi
#else
            skip
#endif
        }
    :: else -> skip
    fi;
    d_step { k = 0; applied = 0; second = 0 }        /* a finished attempt leaves no trace */
}

#ifdef NEG_BATCH_BY_ID
#define BATCH_MATCH(x) (donej[cj[x]])
#else
#define BATCH_MATCH(x) (donef[x])
#endif

/* sql.COMPLETE_MANY_WITH_FOLLOW_UPS: the guarded UPDATE of every trigger, then the follow-ups of
 * exactly the (trigger, lease) pairs that matched, in (trigger, order) order. ONE statement. */
inline batch_commit() {
    c = 0;
    do
    :: c < cn -> donef[c] = GUARD(cj[c], cl[c]);
                 if :: donef[c] -> donej[cj[c]] = 1; record_completion(cj[c], cl[c])
                    :: else -> skip fi;
                 c++
    :: else -> break
    od;
    c = 0;
    do
    :: c < cn -> if :: BATCH_MATCH(c) && ck[c] != 0 -> insert_fu(cj[c], cl[c], ck[c])
                    :: else -> skip fi;
                 c++
    :: else -> break
    od;
    c = 0;
    do
    :: c < cn -> if :: donef[c] -> record_held(cj[c], ck[c]) :: else -> skip fi;
                 donef[c] = 0; c++
    :: else -> break
    od;
    c = 0;
    do :: c < NJ -> donej[c] = 0; c++ :: else -> break od;
    c = 0
}

/* Finalizer._flush_staged: takes the buffer and runs the batch statement; a deadlock or lost
 * connection re-runs the same batch (a trigger already completed replays as stale); any other
 * error, or retries exhausted, redoes the batch job by job through the per-job path. */
proctype Flusher() {
    byte cj[NB], ck[NB], cl[NB], cn, rb, x;
    bool applied;
end_idle:
    do
    :: atomic {
           nb > 0 ->
           c = 0;
           do :: c < nb -> cj[c] = bj[c]; cl[c] = bl[c]; ck[c] = bk[c];
                           bj[c] = 0; bl[c] = 0; bk[c] = 0; c++
              :: else -> break od;
           cn = nb; nb = 0; c = 0;
           rb = 0;
           do
           :: rb > MAXR -> goto per_job                   /* kept failing: job by job */
           :: else ->
               if
               :: true; batch_commit(); break             /* committed, acked */
               :: true; batch_commit(); rb++              /* committed, ack lost: replays stale */
               :: rb++                                    /* deadlock / lost connection */
               :: goto per_job                            /* another error: rolled back */
               fi
           od;
           goto flushed
       };
per_job:
       /* one step per job (each its own transaction) */
       x = 0;
       do
       :: x < cn -> atomic { finalize_per_job(cj[x], cl[x], ck[x], ck[x]); x++ }
       :: else -> break
       od;
flushed:
       skip;
       d_step {
           c = 0;
           do :: c < NB -> cj[c] = 0; cl[c] = 0; ck[c] = 0; c++ :: else -> break od;
           c = 0; cn = 0; rb = 0; x = 0; applied = 0
       }
    od
}

/* The rest of the world: claims, rescue, external callbacks, unique-key release. */
/* sql.CLAIM (promotion of due retryable rows by sql.PROMOTE folded in) */
#define CLAIM(j) \
    :: d_step { st[j] == AVAILABLE && lease[j] < NL -> st[j] = RUNNING; lease[j]++ }
/* sql.RESCUE (stale heartbeat, deadline) and sql.RESCUE_CALLBACKS (callback timeout); the
 * effect of callbacks.retry_external on a waiting job is the same (available, lease kept) */
#define RESCUE(j) \
    :: d_step { (st[j] == RUNNING || st[j] == WAITING) -> \
                if :: lease[j] < NL -> st[j] = AVAILABLE :: else -> st[j] = FAILED fi }
/* callbacks.complete_external (sql.LOCK_BY_CALLBACK + sql.COMPLETE_EXTERNAL: no lease guard, no
 * staged follow-ups) and callbacks.resume_external (sql.RESUME_EXTERNAL) */
#define EXTERNAL(j) \
    :: d_step { (st[j] == RUNNING || st[j] == WAITING) -> st[j] = COMPLETED; done_ext[j] = 1 } \
    :: d_step { st[j] == WAITING -> st[j] = RUNNING }
/* a holder leaves its mask's states (finishes, is pruned, cancelled ...): its key is free */
#define RELEASE(x) \
    :: d_step { fu_live[x] -> fu_live[x] = 0 }

active proctype Env() {
end_env:
    do
    CLAIM(0)
    RESCUE(0)
#ifndef BATCHED
    EXTERNAL(0)
#endif
#if NJ > 1
    CLAIM(1)
    RESCUE(1)
#ifndef BATCHED
    EXTERNAL(1)
#endif
#endif
    RELEASE(0)
    RELEASE(1)
    RELEASE(2)
    RELEASE(3)
    od
}

init {
    atomic {
        st[0] = AVAILABLE;
        run Attempt(0, 1);
        run Attempt(0, 2);
#if NJ > 1
        st[1] = AVAILABLE;
        run Attempt(1, 1);
        run Attempt(1, 2);
#endif
#ifdef BATCHED
        run Flusher()
#endif
    }
}

/* State invariants (checked in every reachable state by Monitor). */
#define ROW_TRACES(x) (x >= nrows || done_lease[fu_trig[x]] == fu_lease[x])
#define TRACES (ROW_TRACES(0) && ROW_TRACES(1) && ROW_TRACES(2) && ROW_TRACES(3))

#define LIVE(x, k) (x < nrows && fu_live[x] && fu_key[x] == k)
#define NLIVE(k) (LIVE(0, k) + LIVE(1, k) + LIVE(2, k) + LIVE(3, k))
#define UNIQUE (NLIVE(1) <= 1 && NLIVE(2) <= 1)

#define HAS_FU(j) (j >= NJ || done_lease[j] == 0 || done_held[j])
#define HAS_FOLLOW_UPS (HAS_FU(0) && HAS_FU(1))

active proctype Monitor() {
end_monitor:
    do
    :: atomic { !TRACES -> FAIL("INVARIANT VIOLATED: follow_up_traces_to_committed_completion\n") }
    :: atomic { !UNIQUE -> FAIL("INVARIANT VIOLATED: at_most_one_live_row_per_key\n") }
    :: atomic { !HAS_FOLLOW_UPS -> FAIL("INVARIANT VIOLATED: completion_has_follow_up_or_holder\n") }
    od
}
