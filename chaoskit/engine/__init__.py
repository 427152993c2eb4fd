"""The run: plan, states, journal, ledger, rollback, watchdog and the steady-state hypothesis."""
