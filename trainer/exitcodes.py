"""The trainer's exit codes: the contract between the trainer and whatever launched it.

SkyPilot's `recover_on_exit_codes` gets PREEMPTED, so a trainer that saved on a notice is relaunched.
"""

OK = 0
ERROR = 1
BAD_CONFIG = 2
#: a preemption notice (SIGTERM or a cloud notice) arrived; a checkpoint was written; relaunch me
PREEMPTED = 75
#: another attempt of the same run took over (fencing); this attempt must not write again
FENCED = 76
#: the store stayed unreachable beyond the retry bound; the last good checkpoint is intact
STORE_UNAVAILABLE = 77
