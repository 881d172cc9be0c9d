/*
 * The lease of a running attempt and its rescue, with a holder that stalls (issue 28;
 * docs/architecture.md, "Which executions can overlap"; awa_fast/worker/liveness.py,
 * heartbeat.py, maintenance.py rescue). models/README.md maps every variable to the code.
 *
 * One job. Process H holds attempt 1 and runs it on its event loop; H's loop can block (a
 * handler's time.sleep) and H's beats can stop committing (the database does not answer, a
 * slow heartbeat statement). Process O is another worker: it rescues by heartbeat age and
 * claims what is available. H runs maintenance and claims too (the one-process case).
 * Time: `age` counts ticks since the last committed beat; rescue needs age == STALE.
 *
 * Timing assumption of the positive configuration (the lease margin, LEASE_MARGIN): once the
 * lease check has fired (age == STALE - 1), the next tick waits until H's loop has run the
 * cancel -- or, with the loop blocked, until H's liveness thread has ended the process.
 *
 * Invariant no_overlapping_executions: attempts 1 and 2 never execute at the same time.
 *
 * Negative configurations (each expected to FAIL with no_overlapping_executions):
 *   NEG_TODAY      the behaviour before issue 28: the heartbeat runs on H's event loop (a
 *                  blocked loop stops it), H's own rescue judges its own live attempt by
 *                  heartbeat age alone, and nothing ends an attempt whose beats stopped
 *   NEG_NO_EXPIRY  beats from the liveness thread and no rescue of its own attempts, but no
 *                  lease check: beats that stop committing let O run the job while H's handler
 *                  still runs
 *   NEG_NO_EXIT    a library process (not a launcher's child): when the beats stop committing
 *                  while the loop is blocked, nothing can end the handler (the residual overlap
 *                  docs/architecture.md names)
 */

#ifdef NEG_TODAY
#define BEAT_ON_LOOP
#define OWN_RESCUE_BY_AGE
#define NO_EXPIRY
#endif
#ifdef NEG_NO_EXPIRY
#define NO_EXPIRY
#endif

#define STALE 3

byte age;              /* ticks since the last committed beat of attempt 1 */
byte lease = 1;        /* awa_fast.jobs.run_lease */
byte st;               /* 0 running, 1 available (rescued or given back), 2 finished */
bool blocked;          /* H's event loop is blocked by its handler */
bool dbdown;           /* H's beats cannot commit */
bool exec1 = 1;        /* ghost: attempt 1's handler executes (in H) */
bool exec2;            /* ghost: attempt 2's handler executes (in O or H) */
bool expiring;         /* H's lease check fired (liveness thread) and the cancel is pending */
byte stalls = 1;       /* loop stalls left to explore */
byte outages = 1;      /* beat outages left to explore */

/* The lease margin: what the lease check starts (a cancel, an exit) happens before the tick on
 * which a rescuer may take the attempt; a library process cannot end a blocked handler. */
#ifdef NO_EXPIRY
#define HELD 0
#else
#ifdef NEG_NO_EXIT
#define HELD (age == STALE - 1 && exec1 && !(expiring && blocked))
#else
#define HELD (age == STALE - 1 && exec1)
#endif
#endif

#define FAIL(msg) printf(msg); assert(false)

active proctype Monitor() {
end_monitor:
    atomic { (exec1 && exec2) -> FAIL("INVARIANT VIOLATED: no_overlapping_executions\n") }
}

active proctype Clock() {
end_tick:
    do
    :: atomic {
           age < STALE && st == 0 && lease == 1 && !HELD -> age++
       }
    od
}

active proctype Holder() {
end_h:
    do
    /* the handler returns (only while the loop runs it) */
    :: atomic { exec1 && !blocked -> exec1 = 0;
                if :: st == 0 && lease == 1 -> st = 2 :: else -> skip fi }
    /* the handler blocks the loop, and later lets it go */
    :: atomic { exec1 && !blocked && stalls > 0 -> blocked = 1; stalls-- }
    :: atomic { blocked -> blocked = 0 }
    /* the beats stop committing, and later commit again */
    :: atomic { !dbdown && outages > 0 -> dbdown = 1; outages-- }
    :: atomic { dbdown -> dbdown = 0 }
    /* a round of beats commits: HEARTBEAT, guarded by the lease */
#ifdef BEAT_ON_LOOP
    :: atomic { exec1 && !dbdown && !blocked && st == 0 && lease == 1 -> age = 0 }
#else
    :: atomic { exec1 && !dbdown && st == 0 && lease == 1 -> age = 0 }
#endif
#ifndef NO_EXPIRY
    /* Liveness._watch_lease: no beat committed for nearly the staleness */
    :: atomic { exec1 && !expiring && age == STALE - 1 -> expiring = 1 }
    /* ... the runtime cancels the handler on the loop (Runtime._lease_expired) */
    :: atomic { expiring && exec1 && !blocked -> exec1 = 0; expiring = 0 }
    /* ... or, the loop blocked, the liveness thread ends the process (a launcher's child) */
#ifndef NEG_NO_EXIT
    :: atomic { expiring && exec1 && blocked -> exec1 = 0; expiring = 0; blocked = 0 }
#endif
#endif
    /* H's own maintenance (on its loop): rescue by heartbeat age */
#ifdef OWN_RESCUE_BY_AGE
    :: atomic { !blocked && age == STALE && st == 0 && lease == 1 -> st = 1; lease = 2 }
#else
    :: atomic { !blocked && !exec1 && age == STALE && st == 0 && lease == 1 -> st = 1; lease = 2 }
#endif
    /* H claims what is available (its loop runs the dispatcher) */
    :: atomic { !blocked && st == 1 && !exec2 -> st = 0; lease = 2; exec2 = 1 }
    od
}

active proctype Other() {
end_o:
    do
    /* O's rescue: heartbeat stale */
    :: atomic { age == STALE && st == 0 && lease == 1 -> st = 1; lease = 2 }
    /* O claims and runs attempt 2, which ends */
    :: atomic { st == 1 && !exec2 -> st = 0; lease = 2; exec2 = 1 }
    :: atomic { exec2 -> exec2 = 0; if :: st == 0 && lease == 2 -> st = 2 :: else -> skip fi }
    od
}
