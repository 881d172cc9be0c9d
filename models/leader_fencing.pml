/*
 * Leader fencing (docs/architecture.md, "The leader's fencing rule"; awa_fast/worker/maintenance.py).
 * models/README.md maps every variable and step to the code and the SQL.
 *
 * Two processes elect a maintenance leader with a session advisory lock held on a dedicated lock
 * connection. The lock connection can be terminated at any time (the lock is released; its owner
 * learns it only at its next election tick), and the other process can then take the lock.
 * Taking leadership bumps the epoch row (the UPDATE waits while any transaction holds the row
 * FOR SHARE). Every write transaction of a leader pass first locks the row FOR SHARE at its
 * epoch; no row means deposed: nothing is written and the process steps down.
 *
 * Invariant: no two processes' leader writes interleave (a write transaction is "writing" from
 * its first write to its commit or rollback).
 *
 * Negative configurations (each expected to FAIL with no_interleaved_leader_writes):
 *   NEG_NO_FENCE       passes write with no fence, as long as the process believes it leads
 *                      (the code before the fencing: checked only at the election tick)
 *   NEG_FENCE_NO_SHARE the fence reads the epoch without FOR SHARE (the bump does not wait)
 *   NEG_CHECK_LOCK_CONN each pass first checks that the lock connection is alive instead
 */

#define NP 2
#define MAXE 4        /* epochs the model explores (each takeover bumps one) */

byte lock_holder;     /* pg_try_advisory_lock(LEADER_LOCK_KEY): 0 free, else holder p+1 */
byte epoch = 1;       /* awa_fast.leader.epoch */
byte shares;          /* transactions holding the leader row FOR SHARE */
bool conn[NP];        /* p's lock connection is open */
bool writing[NP];     /* ghost: a leader write transaction of p is between first write and end */

#define FAIL(msg) printf(msg); assert(false)

proctype Proc(byte p) {
    byte E;           /* Maintenance.epoch */
    bool leader;      /* Maintenance.is_leader (loops running) */
    bool fenced;      /* this pass's transaction holds the row FOR SHARE */

end_loop:
    do
    /* Maintenance._elect while leader: the lock connection still works and the epoch is ours,
     * else _step_down (loops cancelled, lock connection closed) */
    :: atomic {
           leader ->
           if
           :: conn[p] && lock_holder == p + 1 && epoch == E -> skip
           :: else -> leader = 0;
                      if :: lock_holder == p + 1 -> lock_holder = 0 :: else -> skip fi;
                      conn[p] = 0
           fi
       }
    /* Maintenance.acquire: pg_try_advisory_lock (sql.TRY_LEADER) on a fresh lock connection,
     * then in one transaction on it the bump (sql.LEADER_BUMP), which waits for FOR SHARE
     * holders */
    :: atomic { !leader && lock_holder == 0 && epoch < MAXE -> lock_holder = p + 1; conn[p] = 1 };
       if
       :: atomic { shares == 0 && conn[p] && lock_holder == p + 1 -> epoch++; E = epoch; leader = 1 }
       :: atomic { !(conn[p] && lock_holder == p + 1) } ->     /* died while waiting */
              if :: lock_holder == p + 1 -> lock_holder = 0 :: else -> skip fi; conn[p] = 0
       :: atomic { conn[p] && lock_holder == p + 1 } ->       /* lock_timeout: acquire raises, */
              lock_holder = 0; conn[p] = 0                    /* run() steps down */
       fi
    /* one write transaction of a leader pass (Maintenance.fenced around promote, rescue, prune,
     * cron, each reconcile / verify job) */
    :: leader ->
#if defined(NEG_NO_FENCE)
       fenced = 1;
#elif defined(NEG_FENCE_NO_SHARE)
       atomic { if :: epoch == E -> fenced = 1 :: else -> fenced = 0 fi };
#elif defined(NEG_CHECK_LOCK_CONN)
       atomic { if :: conn[p] && lock_holder == p + 1 -> fenced = 1 :: else -> fenced = 0 fi };
#else
       /* sql.LEADER_FENCE: SELECT epoch FROM leader WHERE epoch = E FOR SHARE */
       atomic { if :: epoch == E -> shares++; fenced = 1 :: else -> fenced = 0 fi };
#endif
       if
       :: fenced ->
           writing[p] = 1;                        /* the pass's writes ... */
           atomic {
               writing[p] = 0;                    /* ... until COMMIT (or a rollback) */
#if !defined(NEG_NO_FENCE) && !defined(NEG_FENCE_NO_SHARE) && !defined(NEG_CHECK_LOCK_CONN)
               shares--;
#endif
               fenced = 0
           }
       :: else ->                                 /* Deposed: the process steps down */
           atomic {
               leader = 0;
               if :: lock_holder == p + 1 -> lock_holder = 0 :: else -> skip fi;
               conn[p] = 0
           }
       fi
    od
}

/* a lock connection is terminated (pg_terminate_backend, network) at any time: the lock is
 * gone; its owner learns it at its next election tick */
active proctype Killer() {
end_kill:
    do
    :: atomic { conn[0] && lock_holder == 1 -> lock_holder = 0; conn[0] = 0 }
    :: atomic { conn[1] && lock_holder == 2 -> lock_holder = 0; conn[1] = 0 }
    od
}

init {
    atomic { run Proc(0); run Proc(1) }
}

active proctype Monitor() {
end_monitor:
    atomic { writing[0] && writing[1] -> FAIL("INVARIANT VIOLATED: no_interleaved_leader_writes\n") }
}
