"""The worker runtime: dispatch, execute, finalize, heartbeat, maintenance."""
