/*
 * Leader fencing (docs/architecture.md, "The leader's fencing rule"; awa_fast/worker/maintenance.py;
 * ADR 028). models/README.md maps every variable and step to the code and the SQL.
 *
 * Two processes elect a maintenance leader by the lease row (awa_fast.leader_lease, migration
 * 028). Process 0 connects directly: it first takes a session advisory lock on a dedicated lock
 * connection, and holding it may take over a lease its previous holder took the same way
 * (via_lock). Process 1 runs behind a transaction pooler: no lock, the lease only, taken when it
 * has expired. The lock connection can be terminated at any time (the lock is released; its
 * owner learns it only at its next election tick), and the lease can expire at any time (a
 * leader that stalls, is cut off or dies stops renewing; its own timing is no part of the
 * argument). Taking leadership claims the lease and bumps the epoch row in one transaction
 * (the UPDATE waits while any transaction holds the row FOR SHARE). Every write transaction of
 * a leader pass first locks the row FOR SHARE at its epoch; no row means deposed: nothing is
 * written and the process steps down.
 *
 * Invariant: no two processes' leader writes interleave (a write transaction is "writing" from
 * its first write to its commit or rollback).
 *
 * Positive configurations: the default (one direct process, one pooled), BOTH_DIRECT,
 * BOTH_POOLED.
 *
 * Negative configurations (each expected to FAIL with no_interleaved_leader_writes):
 *   NEG_NO_FENCE       passes write with no fence, as long as the process believes it leads
 *                      (the code before the fencing: checked only at the election tick)
 *   NEG_FENCE_NO_SHARE the fence reads the epoch without FOR SHARE (the bump does not wait)
 *   NEG_CHECK_LOCK_CONN each pass first checks that its process still holds what it was elected
 *                      by (the lock connection alive, or the lease its own) instead of the fence
 */

#define NP 2
#define MAXE 4        /* epochs the model explores (each takeover bumps one) */

byte lock_holder;     /* pg_try_advisory_lock(LEADER_LOCK_KEY): 0 free, else holder p+1 */
byte lease_holder;    /* awa_fast.leader_lease: 0 expired (or released), else holder p+1 */
bool lease_via_lock;  /* leader_lease.via_lock */
byte lease_epoch = 1; /* leader_lease.epoch */
byte epoch = 1;       /* awa_fast.leader.epoch */
byte shares;          /* transactions holding the leader row FOR SHARE */
bool conn[NP];        /* p's lock connection is open */
bool writing[NP];     /* ghost: a leader write transaction of p is between first write and end */

#define FAIL(msg) printf(msg); assert(false)

proctype Proc(byte p) {
#if defined(BOTH_DIRECT)
    bool via_lock = 1;        /* Maintenance.via_lock: both processes connect directly */
#elif defined(BOTH_POOLED)
    bool via_lock = 0;        /* ... both behind a transaction pooler */
#else
    bool via_lock = (p == 0); /* ... process 0 direct, process 1 behind a transaction pooler */
#endif
    byte E;           /* Maintenance.epoch */
    bool leader;      /* Maintenance.is_leader (loops running) */
    bool fenced;      /* this pass's transaction holds the row FOR SHARE */

end_loop:
    do
    /* Maintenance._elect while leader: renew the lease (sql.LEASE_RENEW: only while the lease
     * and the leader row are at E; on the lock connection, which must still work, for the
     * direct process), else _step_down (loops cancelled, lease released if still at E, lock
     * connection closed) */
    :: atomic {
           leader ->
           if
           :: (!via_lock || (conn[p] && lock_holder == p + 1)) && lease_epoch == E && epoch == E ->
                  lease_holder = p + 1
           :: else -> leader = 0;
                      if :: lease_epoch == E -> lease_holder = 0 :: else -> skip fi;
                      if :: lock_holder == p + 1 -> lock_holder = 0 :: else -> skip fi;
                      conn[p] = 0
           fi
       }
    /* Maintenance.acquire: (direct) pg_try_advisory_lock (sql.TRY_LEADER) on a fresh lock
     * connection; then in one transaction the lease claim (sql.LEASE_TAKE: expired, or via_lock
     * over via_lock) and the bump (sql.LEADER_BUMP), which waits for FOR SHARE holders */
    :: atomic { !leader && epoch < MAXE && (!via_lock || lock_holder == 0) ->
                if :: via_lock -> lock_holder = p + 1; conn[p] = 1 :: else -> skip fi };
       if
       :: atomic { shares == 0 && (!via_lock || (conn[p] && lock_holder == p + 1)) &&
                   (lease_holder == 0 || (lease_via_lock && via_lock)) ->
                   lease_holder = p + 1; lease_via_lock = via_lock;
                   epoch++; lease_epoch = epoch; E = epoch; leader = 1 }
       :: atomic { !(lease_holder == 0 || (lease_via_lock && via_lock)) } -> /* lease held: */
              if :: lock_holder == p + 1 -> lock_holder = 0 :: else -> skip fi; /* let the */
              conn[p] = 0                                                     /* lock go */
       :: atomic { via_lock && !(conn[p] && lock_holder == p + 1) } ->       /* died waiting */
              if :: lock_holder == p + 1 -> lock_holder = 0 :: else -> skip fi; conn[p] = 0
       :: atomic {                      /* lock_timeout: the transaction rolls back (nothing */
              if :: lock_holder == p + 1 -> lock_holder = 0 :: else -> skip fi; /* claimed), */
              conn[p] = 0                                            /* run() steps down */
          }
       fi
    /* one write transaction of a leader pass (Maintenance.fenced around promote, rescue, prune,
     * cron, each reconcile / verify job) */
    :: leader ->
#if defined(NEG_NO_FENCE)
       fenced = 1;
#elif defined(NEG_FENCE_NO_SHARE)
       atomic { if :: epoch == E -> fenced = 1 :: else -> fenced = 0 fi };
#elif defined(NEG_CHECK_LOCK_CONN)
       atomic { if :: (via_lock && conn[p] && lock_holder == p + 1) ||
                      (!via_lock && lease_holder == p + 1) -> fenced = 1
                   :: else -> fenced = 0 fi };
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
               if :: lease_epoch == E -> lease_holder = 0 :: else -> skip fi;
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
    /* the lease expires (its holder stopped renewing for heartbeat_staleness_ms) */
    :: atomic { lease_holder != 0 -> lease_holder = 0 }
    od
}

init {
    atomic { run Proc(0); run Proc(1) }
}

active proctype Monitor() {
end_monitor:
    atomic { writing[0] && writing[1] -> FAIL("INVARIANT VIOLATED: no_interleaved_leader_writes\n") }
}
