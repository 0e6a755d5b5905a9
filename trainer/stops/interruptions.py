"""One interruption model from planner to trainer: the prior MTBF for `checkpoint.every: auto`, and which
ended attempts count as interruptions.

- The planner's per-offer interruption rates travel in the task (the SkyPilot renderer sets them):
  FTORCH_INTERRUPTION_RATES = {"<cloud>:<gpus per node>": interruptions per hour of the whole job, ...}
  for every offer the task may land on (and "<cloud>:<region>:<gpus per node>": the hazard model's rate
  in that region, preferred when SKYPILOT_CLUSTER_INFO names the region), and FTORCH_AUTO_MTBF_S = 3600 / rate of the chosen offer. The
  trainer looks its own offer up from SkyPilot's SKYPILOT_CLUSTER_INFO (cloud) and
  SKYPILOT_NUM_GPUS_PER_NODE; elsewhere it uses FTORCH_AUTO_MTBF_S (default 1 h).
- A stop someone asked for (`ftorch cancel`, the budget guard, a policy switch) is not an interruption:
  whoever sends the trainer its SIGTERM for such a reason first writes `control/stop.json` in the run
  store (`request_stop`); the trainer then records its attempt as `ended: stopped` instead of `notice`,
  and the MTBF estimate (trainer/stops/interval.py) leaves it out. A request counts from the
  trainer process's start (a cancel while it loads is still a cancel), not from its epoch claim; one
  that names an epoch (`request_stop(..., epoch=...)`) is in force for that attempt and every later one
  until withdrawn or expired (`request_in_force`).
- Nor is the end of the local supervisor that watched the trainer (FTORCH_SUPERVISOR_PID): the SIGTERM
  its death sends the trainer is recorded as `ended: stopped, stop_reason: supervisor lost`.

No torch here.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

DEFAULT_MTBF_S = 3600.0
#: MTBF used for an offer that is never interrupted (on-demand, Lambda): 30 days
NEVER_S = 30 * 86400.0
STOP_REQUEST = "control/stop.json"
#: the cloud controller's spend record (price, spend so far, budget, when): the trainer logs the cost from it
SPEND_RECORD = "control/spend.json"
#: epoch record `ended` values that are not interruptions
NOT_INTERRUPTIONS = ("finished", "stopped")


def rate_key(cloud: str, gpus_per_node: int, region: str | None = None) -> str:
    """ "cloud:gpus" (any region the task may land in), or "cloud:region:gpus" (the hazard model's rate
    there, which the trainer prefers when SkyPilot says where it runs)."""
    if region:
        return f"{cloud.lower()}:{region}:{int(gpus_per_node)}"
    return f"{cloud.lower()}:{int(gpus_per_node)}"


def mtbf_from_rate(rate_per_hour: float) -> float:
    return NEVER_S if rate_per_hour <= 0 else min(NEVER_S, 3600.0 / rate_per_hour)


def prior_mtbf_s(environ: Mapping[str, str] | None = None) -> tuple[float, str]:
    """(MTBF prior in seconds, where it came from) for this process."""
    env = os.environ if environ is None else environ
    rates = env.get("FTORCH_INTERRUPTION_RATES")
    info = env.get("SKYPILOT_CLUSTER_INFO")
    gpus = env.get("SKYPILOT_NUM_GPUS_PER_NODE")
    if rates and info and gpus:
        try:
            where = json.loads(info)
            cloud, region = str(where.get("cloud", "")), str(where.get("region") or "")
            table = json.loads(rates)
            for key in (rate_key(cloud, int(gpus), region), rate_key(cloud, int(gpus))):
                if key in table:
                    rate = float(table[key])
                    return mtbf_from_rate(rate), f"planner's rate for {key}: {rate:.3f}/h"
        except (ValueError, TypeError, AttributeError):
            pass
    if env.get("FTORCH_AUTO_MTBF_S"):
        try:
            return float(env["FTORCH_AUTO_MTBF_S"]), "FTORCH_AUTO_MTBF_S"
        except ValueError:
            pass
    return DEFAULT_MTBF_S, "default"


def request_stop(
    store: Any, reason: str, epoch: int | None = None, expires_at: float | None = None
) -> dict[str, Any]:
    """Tell the trainer that the SIGTERM about to come is a requested stop, not a preemption.

    With `epoch` (the cloud controller and `ftorch cancel` pass `newest_epoch(store)`, the attempt running
    now) the request is in force for that attempt and every later one of the run until it is withdrawn
    (`withdraw_stop`) or `expires_at` passes: an attempt that SkyPilot restarts while the requester is
    away (a laptop asleep between the request and the cancel) stops too, instead of training on. Without
    one (the local supervisor, which is there to see its own SIGTERM through) it counts for attempts that
    started before it was made."""
    payload = {"reason": reason, "at": time.time(), "epoch": epoch, "expires_at": expires_at}
    store.write_json(STOP_REQUEST, payload)
    return payload


def newest_epoch(store: Any) -> int:
    """The run's newest epoch (the attempt running now, or the last one); 0 when none was claimed."""
    try:
        return int((store.epochs() or [0])[-1])
    except Exception:  # a store without epochs (a test double): the time rule alone
        return 0


def withdraw_stop(store: Any) -> None:
    """The stop was carried out (or given up): a later attempt trains again."""
    try:
        store.remove_file(STOP_REQUEST)
    except FileNotFoundError:
        pass


def request_in_force(request: Any, since: float, epoch: int, now: float | None = None) -> bool:
    """Whether a stop request applies to the attempt that started at `since` and holds `epoch` (0 =
    not claimed yet): made for this attempt's epoch or an earlier one of the run (still in force, not
    withdrawn), or, for one that names no epoch, made after this attempt started."""
    if not isinstance(request, dict):
        return False
    now = time.time() if now is None else now
    expires = request.get("expires_at")
    if isinstance(expires, int | float) and now >= float(expires):
        return False
    named = request.get("epoch")
    if isinstance(named, int) and not isinstance(named, bool) and named > 0 and epoch > 0:
        return named <= epoch
    return float(request.get("at", 0.0)) >= since


def stop_reason(store: Any, since: float) -> str | None:
    """The reason of a stop request in force for this attempt (`request_in_force`), if any."""
    try:
        request = store.read_json_or_none(STOP_REQUEST)
    except Exception:  # advisory: without it the stop counts as a notice
        return None
    if request_in_force(request, since, int(getattr(store, "epoch", 0) or 0)):
        return str(request.get("reason") or "requested")
    return None


SUPERVISOR_LOST = "supervisor lost"


def process_started_at() -> float:
    """When this process started (wall clock; Linux /proc), else when this module was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


def _gone(pid: int) -> bool:
    """The process is gone (or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False


def supervisor_lost(environ: Mapping[str, str] | None = None) -> bool:
    """The local supervisor that started this trainer (FTORCH_SUPERVISOR_PID) has died."""
    pid = (os.environ if environ is None else environ).get("FTORCH_SUPERVISOR_PID", "")
    return pid.isdigit() and _gone(int(pid))


def how_it_ended(store: Any) -> dict[str, str]:
    """The epoch-record fields for an attempt leaving on SIGTERM: a requested stop (cancel, budget, a
    policy switch), the loss of its supervisor, or a notice (an interruption)."""
    if not getattr(store, "epoch", 0):
        return {"ended": "notice"}
    try:
        claimed = float((store.epoch_records().get(store.epoch) or {}).get("claimed_at", 0.0))
    except Exception:  # advisory
        claimed = 0.0
    reason = stop_reason(store, min(claimed, process_started_at()) if claimed else process_started_at())
    if reason is None and supervisor_lost():
        reason = SUPERVISOR_LOST
    return {"ended": "stopped", "stop_reason": reason} if reason else {"ended": "notice"}
