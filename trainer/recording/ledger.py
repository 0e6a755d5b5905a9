"""A run's cost ledger: what it cost, what on demand would have cost, $ per million tokens, and where each
preemption's time went. One torch-free function that the trainer (training summary, model card) and the
orchestrator (`ftorch status JOB`, its `ledger`) both call, from the run store's epoch records.

Each attempt's epoch record carries what it measured (`measured`: steps, tokens, step_s and the restart
phases process_start_s, model_load_s, checkpoint_read_s, first_step_s). The orchestrator adds what only it
saw (its attempts: when each started and ended, the steps it kept; the trainers' last step times); the
trainer side passes none of that, and what cannot be known stays None.

A preemption's loss, for the attempt that ended and the one that followed:
- detection: from the old attempt's last logged step to the end of the attempt: when SkyPilot began
  recovering it (attempt key `detected_at`, from SkyPilot's own timestamps) where known, else the moment
  ftorch recorded its end;
- provisioning: from that end to the new machine, placed: SkyPilot's recovery end (`placed_at`, when the
  job was submitted on the new cluster, before its setup commands) where known, else the next attempt's
  start as ftorch recorded it;
- setup: on SkyPilot from `placed_at` to the trainer's setup (the task's setup commands, the run script and
  the process start: the epoch record's `started_at` + `phases.process_start_s`), else the new trainer's
  process start alone (`phases.process_start_s`: imports, environment);
- loading: the model load and the checkpoint read (`phases.model_load_s + checkpoint_read_s`);
- steps redone: the steps the old attempt took after its last checkpoint, at its measured step time.
Each of detection, provisioning and setup says where its figure came from (`*_source`: "skypilot",
"ftorch" for the orchestrator's own records, "trainer" for the trainer's measurement).
On demand, the same work = the billed time less setup, loading and steps redone (provisioning and
detection fall between billed attempts), at the on-demand price of the chosen offer.
"""

from __future__ import annotations

from typing import Any

#: epoch record `ended` values after which the run did not lose the machine
_NOT_PREEMPTED = ("finished", "stopped")


def number(value: Any) -> float | None:
    """A JSON number as a float; None for anything else (bools included)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _measured(record: dict[str, Any] | None) -> dict[str, Any]:
    found = (record or {}).get("measured")
    return found if isinstance(found, dict) else {}


def _phase(measured: dict[str, Any], name: str) -> float | None:
    phases = measured.get("phases")
    return number(phases.get(name)) if isinstance(phases, dict) else None


def by_attempt(records: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The newest epoch record of each attempt number (an attempt that restarted in place has several)."""
    out: dict[int, dict[str, Any]] = {}
    for epoch in sorted(records):
        record = records[epoch] or {}
        n = record.get("attempt") if isinstance(record.get("attempt"), int) else epoch
        out[n] = {**out.get(n, {}), **record}
    return out


def record_start(store: Any, attempt: int, start_step: int) -> None:
    """Into this attempt's epoch record: the step it starts from, and the step the previous attempt had
    reached by its last progress report (progress.json, read before this attempt rewrites it). A machine
    that vanished without a notice leaves no end step of its own, and its steps after the last checkpoint
    are what this attempt redoes (the ledger's steps redone). Best effort: rank 0 only."""
    try:
        old = store.read_progress() or {}
    except Exception:  # noqa: BLE001 - an unreadable progress file: no previous step
        old = {}
    fields: dict[str, Any] = {"start_step": start_step}
    before, who = old.get("step"), old.get("attempt")
    if isinstance(before, int) and isinstance(who, int) and who != attempt:
        fields["previous_attempt_step"] = {"attempt": who, "step": before}
    store.update_epoch_record(**fields)


def _end_step(n: int, record: dict[str, Any], later: list[dict[str, Any]]) -> int | None:
    """The attempt's last step: its own record's (a graceful end), else the next attempt's report of
    where this one had got to (`previous_attempt_step`)."""
    if isinstance(record.get("step"), int):
        return int(record["step"])
    for other in later:
        seen = other.get("previous_attempt_step")
        if isinstance(seen, dict) and seen.get("attempt") == n and isinstance(seen.get("step"), int):
            return int(seen["step"])
    return None


def attempts_from_records(records: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Attempts as the trainer side knows them: started when its trainer claimed the run, preempted when
    a later attempt followed and it did not end finished or stopped; start step as it recorded it (else
    from its measured steps), end step as it or the next attempt recorded it."""
    mine = by_attempt(records)
    out = []
    numbers = sorted(mine)
    for i, n in enumerate(numbers):
        record = mine[n]
        steps = number(_measured(record).get("steps"))
        end = _end_step(n, record, [mine[m] for m in numbers[i + 1 :]])
        start = record.get("start_step") if isinstance(record.get("start_step"), int) else None
        if start is None and end is not None and steps is not None:
            start = int(end - steps)
        out.append(
            {
                "n": n,
                "started_at": number(record.get("claimed_at")),
                "ended_at": None,
                "start_step": start,
                "end_step": end,
                "preempted": i + 1 < len(numbers) and record.get("ended") not in _NOT_PREEMPTED,
                "hourly_usd": None,
            }
        )
    return out


def _restart_times(
    old: dict[str, Any], new: dict[str, Any], new_record: dict[str, Any], last_step_at: float | None
) -> dict[str, tuple[float | None, str | None]]:
    """detection, provisioning and setup (seconds, source): SkyPilot's timestamps where the attempts
    carry them (`detected_at`, `placed_at`), else the orchestrator's attempt times and the trainer's."""
    sky_end, placed = number(old.get("detected_at")), number(new.get("placed_at"))
    ended = sky_end if sky_end is not None else number(old.get("ended_at"))
    end_source = "skypilot" if sky_end is not None else "ftorch"
    detection = max(0.0, ended - last_step_at) if ended is not None and last_step_at is not None else None
    if sky_end is not None and placed is not None:
        provisioning: tuple[float | None, str | None] = (max(0.0, placed - sky_end), "skypilot")
    else:
        ended, started = number(old.get("ended_at")), number(new.get("started_at"))
        gap = max(0.0, started - ended) if ended is not None and started is not None else None
        provisioning = (gap, None if gap is None else "ftorch")
    process_start = _phase(_measured(new_record), "process_start_s")
    began = number(new_record.get("started_at"))  # the trainer process's start, on the new machine's clock
    if placed is not None and began is not None and process_start is not None:
        setup: tuple[float | None, str | None] = (max(0.0, began + process_start - placed), "skypilot")
    else:
        setup = (process_start, None if process_start is None else "trainer")
    return {
        "detection": (detection, None if detection is None else end_source),
        "provisioning": provisioning,
        "setup": setup,
    }


def preemption_loss(
    old: dict[str, Any],
    new: dict[str, Any],
    new_record: dict[str, Any],
    old_measured: dict[str, Any],
    last_step_at: float | None,
) -> dict[str, Any]:
    """One preemption's loss split (seconds; None where it cannot be known). `new_record`: the next
    attempt's epoch record (its `measured` and `started_at`)."""
    new_measured = _measured(new_record)
    times = _restart_times(old, new, new_record, last_step_at)
    parts = [_phase(new_measured, "model_load_s"), _phase(new_measured, "checkpoint_read_s")]
    loading = sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None
    redone = None
    if isinstance(old.get("end_step"), int) and isinstance(new.get("start_step"), int):
        redone = max(0, old["end_step"] - new["start_step"])
    step_s = number(old_measured.get("step_s")) or number(new_measured.get("step_s"))
    redo_s = redone * step_s if redone is not None and step_s is not None else None
    if redone == 0:
        redo_s = 0.0
    split = {"detection_s": times["detection"][0], "provisioning_s": times["provisioning"][0],
             "setup_s": times["setup"][0], "loading_s": loading, "redo_s": redo_s}  # fmt: skip
    known = [v for v in split.values() if v is not None]
    return {
        "attempt": old.get("n"),
        "next_attempt": new.get("n"),
        **{k: None if v is None else round(v, 3) for k, v in split.items()},
        "steps_redone": redone,
        "total_s": round(sum(known), 3) if known else None,
        **{f"{name}_source": source for name, (_value, source) in times.items()},
    }


def compute_ledger(
    records: dict[int, dict[str, Any]],
    *,
    spent_usd: float | None,
    hourly_usd: float | None,
    ondemand_hourly_usd: float | None,
    attempts: list[dict[str, Any]] | None = None,
    tokens: int | None = None,
    last_step_at: dict[int, float] | None = None,
) -> dict[str, Any]:
    """The ledger of a run. `attempts` (dicts with n, started_at, ended_at, start_step, end_step,
    preempted, hourly_usd, and on SkyPilot detected_at / placed_at from its own timestamps) default to what the epoch records say; `tokens` to the attempts' measured
    tokens; `last_step_at`: each attempt's last logged step time (for detection)."""
    mine = by_attempt(records)
    own = {a["n"]: a for a in attempts_from_records(records)}
    # the orchestrator's attempts, with the steps only the trainers recorded where it has none (SkyPilot)
    attempts = (
        [
            {**a, **{k: own.get(a["n"], {}).get(k) for k in ("start_step", "end_step") if a.get(k) is None}}
            for a in attempts
        ]
        if attempts is not None
        else list(own.values())
    )
    last_step_at = last_step_at or {}
    losses = []
    for old, new in zip(attempts, attempts[1:], strict=False):
        if old.get("preempted"):
            losses.append(
                preemption_loss(
                    old,
                    new,
                    mine.get(new["n"]) or {},
                    _measured(mine.get(old["n"])),
                    last_step_at.get(old["n"]),
                )
            )
    if tokens is None:
        counted = [number(_measured(r).get("tokens")) for r in mine.values()]
        tokens = (
            int(sum(t for t in counted if t is not None)) if any(t is not None for t in counted) else None
        )
    paid_s = _paid_seconds(attempts, spent_usd, hourly_usd)
    wasted_s = sum((loss[k] or 0.0) for loss in losses for k in ("setup_s", "loading_s", "redo_s"))
    ondemand = None
    if ondemand_hourly_usd is not None and paid_s is not None:
        ondemand = max(0.0, paid_s - wasted_s) / 3600.0 * ondemand_hourly_usd
    savings = None if ondemand is None or spent_usd is None else ondemand - spent_usd
    return {
        "spent_usd": None if spent_usd is None else round(spent_usd, 6),
        "hourly_usd": hourly_usd,
        "ondemand_hourly_usd": ondemand_hourly_usd,
        "ondemand_usd": None if ondemand is None else round(ondemand, 6),
        "savings_usd": None if savings is None else round(savings, 6),
        "savings_pct": round(100.0 * savings / ondemand, 2) if savings is not None and ondemand else None,
        "tokens": tokens,
        "usd_per_million_tokens": (
            round(spent_usd / tokens * 1e6, 6) if spent_usd is not None and tokens else None
        ),
        "preemptions": losses,
        "lost_s": round(sum(loss["total_s"] or 0.0 for loss in losses), 3) if losses else 0.0,
        "health": _health(mine),
        "unhealthy_stop": unhealthy_stop(mine, hourly_usd, spent_usd),
    }


def unhealthy_stop(
    mine: dict[int, dict[str, Any]], hourly_usd: float | None, spent_usd: float | None
) -> dict[str, Any] | None:
    """What ending an UNHEALTHY run saved: the steps it did not run x the last attempt's own seconds per
    step x the hourly price, against the run's projected cost (spent + that). None unless the newest
    attempt ended unhealthy; the figures None where the price or the step time is not known. This
    covers the steps only (not a relaunch's setup, nor the evals and checkpoints they would have had)."""
    if not mine:
        return None
    last = mine[max(mine)]
    if last.get("ended") != "unhealthy":
        return None
    step, total = number(last.get("step")), number(last.get("total_steps"))
    step_s = number(_measured(last).get("step_s"))
    left = None if step is None or total is None else max(0.0, total - step)
    hours = None if left is None or step_s is None else left * step_s / 3600.0
    saved = None if hours is None or hourly_usd is None else hours * hourly_usd
    projected = None if saved is None or spent_usd is None else spent_usd + saved
    return {
        "at_step": None if step is None else int(step),
        "total_steps": None if total is None else int(total),
        "steps_left": None if left is None else int(left),
        "projected_remaining_h": None if hours is None else round(hours, 6),
        "saved_usd": None if saved is None else round(saved, 6),
        "projected_usd": None if projected is None else round(projected, 6),
    }


def _health(mine: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """What the health checks did (trainer/health/rules.py): steps skipped and rollbacks, over every attempt
    (each record holds its attempt's counters, carried on from the checkpoint it resumed from)."""
    recorded = [r["health"] for _n, r in sorted(mine.items()) if isinstance(r.get("health"), dict)]
    health = recorded[-1] if recorded else None
    if not isinstance(health, dict):
        return {"skipped_steps": 0, "rollbacks": []}
    return {
        "skipped_steps": int(health.get("skipped") or 0),
        "rollbacks": list(health.get("rollbacks") or []),
    }


def _paid_seconds(attempts: list[dict[str, Any]], spent: float | None, hourly: float | None) -> float | None:
    """Billed seconds: the attempts' own spans when all ended ones are known, else spent / hourly price."""
    spans = [(number(a.get("started_at")), number(a.get("ended_at"))) for a in attempts]
    if attempts and all(s is not None and e is not None for s, e in spans):
        return sum(e - s for s, e in spans)  # type: ignore[operator]
    if spent is not None and hourly:
        return spent / hourly * 3600.0
    return None


def fmt_usd(value: float | None) -> str:
    """'$1.23', or '-' when not known (the card and status show the same)."""
    return "-" if value is None else f"${value:.2f}"


def ledger_lines(ledger: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of a ledger for the model card and `ftorch status JOB`; '-' where unknown."""
    pct = ledger.get("savings_pct")
    saved = (
        "n/a (no on-demand price for this offer)"
        if ledger.get("ondemand_usd") is None
        else f"{fmt_usd(ledger.get('savings_usd'))} ({'-' if pct is None else f'{pct:.0f}%'}) "
        f"vs {fmt_usd(ledger.get('ondemand_usd'))} on demand"
    )
    per_m = ledger.get("usd_per_million_tokens")
    rows = [
        ("spent", fmt_usd(ledger.get("spent_usd"))),
        ("saved", saved),
        ("per 1M tokens", "-" if per_m is None else f"${per_m:.4f}"),
    ]
    moved = ledger.get("data_movement")
    if moved:
        rows.append(("data movement", f"{fmt_usd(moved.get('total_usd'))} ({moved.get('gb', 0):.1f} GB to and from the "
                     f"run store in {moved.get('store')})"))  # fmt: skip
    stop = ledger.get("unhealthy_stop")
    if stop:
        hours = stop.get("projected_remaining_h")
        rows.append(
            (
                "unhealthy stop saved",
                f"{fmt_usd(stop.get('saved_usd'))} ({stop.get('steps_left')} steps left,"
                f" {'-' if hours is None else f'{hours:.2f} h'}) of {fmt_usd(stop.get('projected_usd'))}"
                f" projected; spent {fmt_usd(ledger.get('spent_usd'))}",
            )
        )
    for rollback in (ledger.get("health") or {}).get("rollbacks") or []:
        rows.append(
            (
                "rollback",
                f"at step {rollback.get('at_step')} to the healthy checkpoint of step {rollback.get('to_step')}"
                f" ({rollback.get('reason')})",
            )
        )
    for loss in ledger.get("preemptions") or []:
        cells = ", ".join(
            f"{name} {_s(loss.get(key))}"
            for name, key in (("detection", "detection_s"), ("provisioning", "provisioning_s"),
                              ("setup", "setup_s"), ("loading", "loading_s"), ("redo", "redo_s"))
        )  # fmt: skip
        redone = loss.get("steps_redone")
        rows.append(
            (
                f"preemption {loss.get('attempt')}",
                f"{cells} ({'-' if redone is None else redone} steps redone)",
            )
        )
    return rows


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"
