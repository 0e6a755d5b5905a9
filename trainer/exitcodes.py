"""The trainer's exit codes: the contract between the trainer and whatever launched it.

SkyPilot's `recover_on_exit_codes` gets PREEMPTED, so a trainer that saved on a notice is relaunched.
The CLI's own codes (`--follow` per end state: 0 SUCCEEDED, 3 FAILED, 4 CANCELLED, 5 STOPPED) are in
orchestrator/cli/follow.py (FOLLOW_EXIT_CODES) and the README.
"""

OK = 0
ERROR = 1
BAD_CONFIG = 2
#: the budget stop (trainer/stops/budget.py): a checkpoint was written and the epoch record says
#: `stop_reason: budget`; 0 so that SkyPilot does not restart it (its managed job ends SUCCEEDED, which
#: ftorch reads as STOPPED (budget) from the run store); the local supervisor maps it the same way
BUDGET_STOPPED = OK
#: a preemption notice (SIGTERM or a cloud notice) arrived; a checkpoint was written; relaunch me
PREEMPTED = 75
#: another attempt of the same run took over (fencing); this attempt must not write again
FENCED = 76
#: the store stayed unreachable beyond the retry bound, or is full (ENOSPC, named in the last log line);
#: the last good checkpoint is intact
STORE_UNAVAILABLE = 77
#: the task's setup (trainer/envlock.py): an installed library is not the run's lock, or the Python is not
#: the lock's (sysexits' EX_CONFIG); not in recover_on_exit_codes: an attempt under other versions never starts
ENV_MISMATCH = 78
#: out of memory in a step: the trainer recorded a smaller micro-batch per GPU (same effective batch) in
#: spec.json (trainer/train_step/oom.py); start the next attempt from the newest checkpoint, no crash counted
OOM_ADAPT = 88
#: out of memory with the smallest layout (1 example per GPU, gradient checkpointing on): the measured
#: peak is in spec.json `does_not_fit`; never retried on the same machine, the job needs a re-plan
DOES_NOT_FIT = 89
#: the health checks (trainer/health/rules.py) ended the run: non-finite losses or spikes that rollbacks did
#: not cure. Never restarted (not in SkyPilot's recover_on_exit_codes; the local supervisor ends the job
#: UNHEALTHY); the epoch record says why, and the newest healthy checkpoint is kept
UNHEALTHY = 86
#: the trainer's watchdog (trainer/stops/watchdog.py): no step within the stall timeout (a hung collective,
#: a dead mount); the launcher restarts it once from the newest checkpoint; two stalls without progress
#: between them end the run UNHEALTHY
STALLED = 87
