"""The run store: one folder per run on any fsspec filesystem. No torch here.

Layout under `run_uri` (= `<checkpoint.uri>/<run_id>`):

    spec.json                       the resolved job spec (written once at launch)
    progress.json                   the latest progress snapshot (rewritten every few seconds)
    metrics/<attempt>-<part>.jsonl  the metric history, one row per logged step
    checkpoints/step-00000020/      one folder per checkpoint; MANIFEST.json is written last
        e00000003/<files>           the files, in a folder of the epoch that wrote them (fenced attempts)
    fence/epoch-00000003.json       one object per attempt that claimed the run (created conditionally)
    cache/                          derived data that later attempts reuse (the tokenised data set)
    output/                         the final adapter (or HF model), unless output.uri says otherwise

A checkpoint exists only once its MANIFEST.json (files, sizes, sha256) is there and parses; readers
verify the files against it before trusting them.

Fencing: an attempt claims the next epoch with a conditional create (If-None-Match on S3, O_EXCL on a
local disk). Before every commit, prune and progress write it checks that no newer epoch exists, and
raises `Fenced` if one does. Its files go under its own epoch folder and the manifest is created
conditionally, so even a write racing past the check can neither overwrite a newer attempt's files nor
replace its manifest; deletions re-read the manifest and never touch a newer epoch's checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trainer.faults import maybe_die, maybe_disk_full
from trainer.runstore import finite_json
from trainer.runstore.runfiles import checked_progress
from trainer.runstore.storage import LinkRefused, Storage, StoreError, sha256_bytes

MANIFEST = "MANIFEST.json"
FENCE = "fence"
EPOCH_PREFIX = "epoch-"
#: the key of what an attempt measured in its epoch record (trainer/recording/measure.py writes it)
MEASURED = "measured"
CACHE = "cache"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "step-"
PROGRESS = "progress.json"
SPEC = "spec.json"
METRICS = "metrics"
OUTPUT = "output"
LOGS = "logs"


#: the digest of the spec.json the local supervisor wrote just before starting this attempt: the trainer
#: trains with exactly that or refuses (one written into the store in between is data, never this job's)
SPEC_DIGEST_ENV = "FTORCH_SPEC_DIGEST"


def spec_digest(resolved: Any) -> str:
    """sha256 of a spec.json's content, independent of key order and spacing."""
    return sha256_bytes(json.dumps(resolved, sort_keys=True, separators=(",", ":")).encode())


class SpecNotPinned(ValueError):
    """spec.json is not the one this attempt's supervisor wrote (SPEC_DIGEST_ENV)."""


def check_pinned(resolved: Any) -> None:
    """Raise SpecNotPinned when a supervisor pinned spec.json for this attempt and it changed since."""
    expected = os.environ.get(SPEC_DIGEST_ENV)
    if expected and spec_digest(resolved) != expected:
        raise SpecNotPinned(
            f"{SPEC} in the run store changed after this job's supervisor wrote it (digest "
            f"{spec_digest(resolved)[:12]}, written {expected[:12]}): not trained with it; the job's own "
            "settings are in its registry (`ftorch resume` writes them again)"
        )


class CorruptCheckpoint(StoreError):
    """A checkpoint's files do not match its manifest."""


class StoreGone(StoreError):
    """The run store's own records vanished under a running attempt."""


class Fenced(StoreError):
    """A newer attempt claimed this run: this attempt must stop writing."""


def _relative(path: str) -> bool:
    """A path that stays where it is joined: not absolute, no '..' part."""
    return not path.startswith(("/", "\\")) and ".." not in path.replace("\\", "/").split("/")


def _good_file(rel: Any, entry: Any) -> bool:
    """A manifest's files entry: a relative path with a size and a sha256."""
    return (
        isinstance(rel, str) and bool(rel) and _relative(rel) and isinstance(entry, dict)
        and isinstance(entry.get("size"), int) and not isinstance(entry.get("size"), bool)
        and entry["size"] >= 0 and isinstance(entry.get("sha256"), str)
    )  # fmt: skip


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def step_of(name: str) -> int | None:
    base = name.rstrip("/").rsplit("/", 1)[-1]
    if not base.startswith(CHECKPOINT_PREFIX):
        return None
    try:
        return int(base[len(CHECKPOINT_PREFIX) :])
    except ValueError:
        return None


@dataclass
class CheckpointInfo:
    step: int
    path: str
    created_at: float
    files: dict[str, dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0
    dir: str = ""

    @property
    def size_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())


@dataclass
class CheckpointListing:
    """The run's step folders as listed once, with the manifests read then (one start of the trainer
    lists the store once and passes this around: each listing is a request on s3://)."""

    #: step folders (not links), oldest first
    names: list[str]
    #: name -> its checkpoint, for the folders whose manifest was readable
    manifests: dict[str, CheckpointInfo]
    #: step folders that are links (local stores): never followed
    links: list[str] = field(default_factory=list)
    #: name -> what is wrong with its manifest, for folders whose manifest is there but damaged
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> list[CheckpointInfo]:
        """Checkpoints with a readable manifest, oldest first (files not verified yet)."""
        return [self.manifests[n] for n in self.names if n in self.manifests]

    @property
    def newest(self) -> CheckpointInfo | None:
        """The newest checkpoint with a readable manifest (files not verified: `RunStore.newest_good`
        walks back from it to the newest that loads)."""
        complete = self.complete
        return complete[-1] if complete else None

    @property
    def newest_healthy(self) -> CheckpointInfo | None:
        """The newest checkpoint with a readable manifest that is healthy (`is_healthy`)."""
        healthy = [c for c in self.complete if is_healthy(c)]
        return healthy[-1] if healthy else None

    def forget(self, name: str) -> None:
        """A folder this start deleted."""
        self.names = [n for n in self.names if n != name]
        self.manifests.pop(name, None)


def is_healthy(info: CheckpointInfo) -> bool:
    """The manifest's `healthy` (trainer/health/rules.py); checkpoints written before it existed are healthy."""
    return info.meta.get("healthy", True) is not False


def healthy_listing(
    listing: CheckpointListing, log: Callable[[str], None] | None = None
) -> CheckpointListing:
    """The listing without its unhealthy checkpoints (what a resume, a rollback and an export may read)."""
    sick = [n for n in listing.names if n in listing.manifests and not is_healthy(listing.manifests[n])]
    if sick and log is not None:
        log(f"not resuming from unhealthy checkpoint(s): {', '.join(sick)}")
    names = [n for n in listing.names if n not in sick]
    return CheckpointListing(
        names,
        {n: i for n, i in listing.manifests.items() if n not in sick},
        listing.links,
        dict(listing.problems),  # a damaged manifest is still named for what it is (not "no manifest")
    )


T = TypeVar("T")


class RunStore(Storage):
    """A run's folder (`trainer.runstore.storage.Storage`): fencing, manifest-last checkpoints, progress, spec."""

    def __init__(
        self,
        run_uri: str,
        storage_options: dict[str, Any] | None = None,
        retry_seconds: float | None = None,
        within: str | None = None,
    ) -> None:
        super().__init__(run_uri, storage_options, retry_seconds, within)
        self.run_uri = self.root_uri
        self.epoch = 0  # 0: not fenced (tools, tests); the trainer claims one with claim_epoch()
        self.fenced_by: int | None = None

    # ---- fencing ------------------------------------------------------------------------------
    def epochs(self) -> list[int]:
        found = []
        for name in self.listdir(FENCE):
            stem = name.removeprefix(EPOCH_PREFIX).removesuffix(".json")
            if name.startswith(EPOCH_PREFIX) and stem.isdigit():
                found.append(int(stem))
        return sorted(found)

    def epoch_records(self) -> dict[int, dict[str, Any]]:
        """Each epoch's record, its values type-checked (runstore/recordcheck.py); a record that is a link
        out of the store, or not an object, is history without facts (one warning line), never an error."""
        from trainer.runstore.recordcheck import clean_epoch_record, warn

        records: dict[int, dict[str, Any]] = {}
        for n in self.epochs():
            rel = _epoch_rel(n)
            try:
                raw = self.read_json_or_none(rel)
            except LinkRefused:
                warn(f"{self.run_uri}/{rel}", "a link out of the run store; skipped as history")
                raw = None
            records[n] = clean_epoch_record(raw, f"{self.run_uri}/{rel}")
        return records

    def claim_epoch(self, record: dict[str, Any] | None = None) -> int:
        """Claim the next epoch of this run for this attempt (a conditional create: one winner)."""
        candidate = (self.epochs() or [0])[-1] + 1
        while True:
            payload = {"epoch": candidate, "claimed_at": time.time(), **(record or {})}
            try:
                self.write_bytes(_epoch_rel(candidate), json.dumps(payload).encode(), create=True)
            except FileExistsError:
                candidate = max(candidate + 1, (self.epochs() or [0])[-1] + 1)
                continue
            self.epoch = candidate
            return candidate

    def update_epoch_record(self, **fields: Any) -> None:
        """Add to this attempt's own epoch record (e.g. how it ended). Best effort."""
        if not self.epoch:
            return
        try:
            record = self.read_json_or_none(_epoch_rel(self.epoch)) or {}
            self.write_json(_epoch_rel(self.epoch), {**record, **fields}, atomic=False)
        except Exception:  # advisory
            pass

    def check_fence(self) -> None:
        """Raise Fenced if a newer attempt claimed the run (sticky once seen)."""
        if not self.epoch:
            return
        if self.fenced_by is None:
            newest = (self.epochs() or [0])[-1]
            if newest > self.epoch:
                self.fenced_by = newest
        if self.fenced_by is not None:
            raise Fenced(
                f"attempt epoch {self.epoch} was replaced by epoch {self.fenced_by} of the same run; "
                "this attempt stops without writing"
            )

    # ---- checkpoints ---------------------------------------------------------------------------
    def commit_checkpoint(
        self, step: int, blobs: dict[str, bytes], meta: dict[str, Any] | None = None
    ) -> str:
        """Write a checkpoint's files, then its manifest (with `meta`: the writer's, e.g. the trainer's
        spec fingerprint, versions, attempt and health). Returns the checkpoint's folder name.

        The files go to this epoch's own folder; the manifest is created only if none is there, or
        replaces one written by this or an older epoch (never a newer one's).
        """
        self.check_fence()
        name = checkpoint_name(step)
        folder = f"{CHECKPOINTS}/{name}"
        sub = _epoch_dir(self.epoch)
        files: dict[str, dict[str, Any]] = {
            rel: {"size": len(data), "sha256": sha256_bytes(data)} for rel, data in blobs.items()
        }
        if _POINTS_ACTIVE():
            for rel, data in blobs.items():  # one at a time, so a kill can land between files
                self.write_bytes(_join(folder, sub, rel), data, atomic=False)
                maybe_die("checkpoint-partial", step)
                maybe_disk_full("store-full", step)
        else:
            self.write_many({_join(folder, sub, rel): data for rel, data in blobs.items()})
        maybe_die("before-manifest", step)
        self.sync_tree(folder)
        manifest = {
            "format": 2,
            "step": step,
            "epoch": self.epoch,
            "dir": sub,
            "created_at": time.time(),
            "files": files,
            "meta": dict(meta or {}),
        }
        self.check_fence()
        body = json.dumps(manifest, indent=1, sort_keys=True).encode()
        rel = f"{folder}/{MANIFEST}"
        try:
            self.write_bytes(rel, body, create=True)
        except FileExistsError:
            existing = self.read_json_or_none(rel)
            theirs = existing.get("epoch") if isinstance(existing, dict) else 0
            if not isinstance(theirs, int) or isinstance(theirs, bool):
                theirs = 0  # a damaged manifest's epoch (the resume skipped it): replaced like an older one
            if theirs > self.epoch:
                self.fenced_by = theirs
                raise Fenced(
                    f"{folder} was committed by epoch {theirs}; epoch {self.epoch} does not replace it"
                ) from None
            # ours or older (e.g. a corrupt one the resume skipped): replace it
            self.remove_file(rel)
            self.write_bytes(rel, body, create=True)
        return name

    def _manifest(self, name: str) -> CheckpointInfo | str | None:
        """The checkpoint of step folder `name`; None without a manifest; what is wrong with a manifest
        that is there but not a checkpoint's (damaged or tampered: every value is checked before use)."""
        manifest = self.read_json_or_none(f"{CHECKPOINTS}/{name}/{MANIFEST}")
        step = step_of(name)
        if manifest is None or step is None:
            return None
        if not isinstance(manifest, dict):
            return "its manifest is not a JSON object"
        if manifest.get("step") != step or isinstance(manifest.get("step"), bool):
            return f"its manifest's step {str(manifest.get('step'))[:40]!r} is not the folder's step {step}"
        files, meta, epoch, where = (manifest.get(k) for k in ("files", "meta", "epoch", "dir"))
        if not isinstance(files, dict) or not files or not all(_good_file(r, f) for r, f in files.items()):
            return "its manifest's files are not relative paths with sizes and checksums"
        if meta is not None and not isinstance(meta, dict):
            return "its manifest's meta is not an object"
        if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0):
            return "its manifest's epoch is not a number"
        if where is not None and not (isinstance(where, str) and _relative(where)):
            return "its manifest's dir is not a folder inside the checkpoint"
        created = manifest.get("created_at")
        return CheckpointInfo(
            step=step,
            path=f"{CHECKPOINTS}/{name}",
            created_at=float(created)
            if isinstance(created, int | float) and not isinstance(created, bool)
            else 0.0,
            files=files,
            meta=meta or {},
            epoch=epoch or 0,
            dir=where or "",
        )

    def _step_folders(self) -> tuple[list[str], list[str]]:
        """(step folders, linked step folders), from one listing of checkpoints/."""
        entries = [n for n in self.listdir(CHECKPOINTS) if step_of(n) is not None]
        links = [n for n in entries if self.is_local and os.path.islink(self.path(CHECKPOINTS, n))]
        names = [n for n in entries if n not in links]  # a linked folder is not part of this run store
        return sorted(names, key=lambda n: step_of(n) or 0), links

    def list_checkpoints(self) -> CheckpointListing:
        """The step folders and their manifests: one listing, one read per manifest."""
        names, links = self._step_folders()
        read = {n: self._manifest(n) for n in names}
        manifests = {n: info for n, info in read.items() if isinstance(info, CheckpointInfo)}
        problems = {n: info for n, info in read.items() if isinstance(info, str)}
        return CheckpointListing(names, manifests, links, problems)

    def checkpoint_names(self) -> list[str]:
        return self._step_folders()[0]

    def complete_checkpoints(self, listing: CheckpointListing | None = None) -> list[CheckpointInfo]:
        """Checkpoints with a readable manifest, oldest first (files not verified yet)."""
        return (listing or self.list_checkpoints()).complete

    def read_checkpoint(self, info: CheckpointInfo) -> dict[str, bytes]:
        """All files of a checkpoint, verified against its manifest (size and sha256)."""
        blobs: dict[str, bytes] = {}
        for rel, expected in info.files.items():
            where = _join(info.path, info.dir, rel)
            try:
                data = self.read_bytes(where)
            except FileNotFoundError:
                raise CorruptCheckpoint(f"{where} is missing") from None
            except LinkRefused:  # a bad checkpoint like any other: the previous one is used
                raise CorruptCheckpoint(f"{where} is a link out of the run store (not followed)") from None
            if len(data) != int(expected["size"]) or sha256_bytes(data) != expected["sha256"]:
                raise CorruptCheckpoint(f"{where} does not match its manifest")
            blobs[rel] = data
        return blobs

    def newest_good(
        self,
        load: Callable[[CheckpointInfo], T],
        on_skip: Callable[[CheckpointInfo | str, str], None] | None = None,
        agree: Callable[[bool], bool] | None = None,
        listing: CheckpointListing | None = None,
    ) -> tuple[CheckpointInfo, T] | None:
        """The newest checkpoint that `load` takes, newest first; (info, what load returned) or None.

        A folder without a manifest is skipped, and so is a checkpoint whose `load` raises
        CorruptCheckpoint. `agree` (several ranks): any rank failing -> every rank skips it."""
        listing = listing or self.list_checkpoints()
        for name in reversed(listing.names):
            info = listing.manifests.get(name)
            if info is None:
                if on_skip:
                    on_skip(name, listing.problems.get(name) or "incomplete (no manifest)")
                continue
            error: str | None = None
            try:
                value = load(info)
            except CorruptCheckpoint as exc:
                error = str(exc)
            if agree(error is not None) if agree else error is not None:
                if on_skip:
                    on_skip(info, error or "another rank could not read it")
                continue
            return info, value
        return None

    def newest_valid_checkpoint(
        self,
        on_skip: Callable[[CheckpointInfo | str, str], None] | None = None,
        decode: Callable[[dict[str, bytes]], Any] | None = None,
        listing: CheckpointListing | None = None,
    ) -> tuple[CheckpointInfo, Any] | None:
        """The newest checkpoint whose files verify; corrupt or incomplete ones are skipped.

        With `decode`, (info, decode(files)): a checkpoint whose decode raises CorruptCheckpoint is
        skipped the same way (e.g. one that cannot be loaded safely)."""

        def load(info: CheckpointInfo) -> Any:
            blobs = self.read_checkpoint(info)
            return decode(blobs) if decode else blobs

        return self.newest_good(load, on_skip, listing=listing)

    def remove_partial_checkpoints(self, listing: CheckpointListing | None = None) -> list[str]:
        """At the start of an attempt: delete the files older epochs left in step folders without a
        manifest (a kill or a full disk mid-save). Only epochs older than this one's are touched, so a
        save of a newer attempt is never disturbed; on a full disk this is what frees the space.
        A `listing` given is kept up to date with the folders removed."""
        self.check_fence()
        if not self.epoch:
            return []
        listing = listing or self.list_checkpoints()
        removed = []
        for name in [n for n in listing.names if n not in listing.manifests]:
            folder = f"{CHECKPOINTS}/{name}"
            entries = self.listdir(folder)
            older = [e for e in entries if e.startswith("e") and e[1:].isdigit() and int(e[1:]) < self.epoch]
            for entry in older:
                self.remove_tree(f"{folder}/{entry}")
            if older and not isinstance(self._manifest(name), CheckpointInfo):
                removed.append(name)
                if len(older) == len(entries):
                    self.remove_tree(folder)
                    listing.forget(name)
        return removed

    def prune_checkpoints(
        self, keep: int, protect_above: int | None = None, listing: CheckpointListing | None = None
    ) -> list[str]:
        """Keep the newest `keep` complete checkpoints; delete older ones and incomplete leftovers.

        The manifest goes first, so a checkpoint that is half deleted is never taken for complete.
        Incomplete folders newer than the newest complete one are left alone (a save may be running).
        A fenced attempt deletes nothing, and a checkpoint of a newer epoch is never deleted.
        """
        self.check_fence()
        listing = listing or self.list_checkpoints()
        names = listing.names
        complete = listing.complete
        complete_names = [c.path.rsplit("/", 1)[-1] for c in complete]
        doomed = complete_names[:-keep] if keep > 0 else complete_names
        healthy = listing.newest_healthy
        if healthy:  # checkpoint.keep never deletes the newest healthy checkpoint (trainer/health/rules.py)
            doomed = [n for n in doomed if n != healthy.path.rsplit("/", 1)[-1]]
        newest_complete = complete[-1].step if complete else None
        leftovers = [
            n
            for n in names
            if n not in complete_names and newest_complete is not None and (step_of(n) or 0) < newest_complete
        ]
        removed = []
        for name in listing.links:
            self.remove_tree(f"{CHECKPOINTS}/{name}")
            removed.append(name)
        for name in [*doomed, *leftovers]:
            if protect_above is not None and (step_of(name) or 0) > protect_above:
                continue
            current = self._manifest(name)  # read again right before deleting
            current = current if isinstance(current, CheckpointInfo) else None
            if current is not None and current.epoch > self.epoch:
                continue
            if name in leftovers and current is not None:
                continue  # it became complete meanwhile
            self.remove_file(f"{CHECKPOINTS}/{name}/{MANIFEST}")
            self.remove_tree(f"{CHECKPOINTS}/{name}")
            removed.append(name)
        return removed

    # ---- progress and metrics ------------------------------------------------------------------
    def write_progress(self, progress: dict[str, Any]) -> None:
        self.check_fence()
        self.write_json(PROGRESS, progress, atomic=False)

    def read_progress(self) -> dict[str, Any] | None:
        """The progress snapshot, or None when there is none or it does not check out (runfiles)."""
        return checked_progress(self.read_json_or_none(PROGRESS))

    def write_metrics_part(self, attempt: int, part: int, rows: Iterable[dict[str, Any]]) -> None:
        self.check_fence()
        body = "".join(finite_json.dumps(r, sort_keys=True) + "\n" for r in rows)
        self.write_bytes(f"{METRICS}/{attempt:04d}-{part:04d}.jsonl", body.encode(), atomic=False)

    def read_metrics(self) -> list[dict[str, Any]]:
        """The metric history across attempts, one row per step: for a step logged by several attempts (an
        attempt trains again the steps after the checkpoint it resumed from), the newest attempt's row."""
        by_step: dict[int, dict[str, Any]] = {}
        for name in sorted(self.listdir(METRICS), key=_part_order):
            if not name.endswith(".jsonl"):
                continue
            try:
                text = self.read_bytes(f"{METRICS}/{name}").decode()
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if (
                    isinstance(row, dict)
                    and isinstance(row.get("step"), int)
                    and isinstance(row.get("loss"), (int, float, type(None)))
                ):
                    by_step[row["step"]] = row
        return [by_step[s] for s in sorted(by_step)]

    # ---- is the store still there --------------------------------------------------------------
    def check_intact(self) -> None:
        """StoreGone if spec.json or this attempt's epoch record vanished (the run store was deleted or
        replaced under the running trainer): the run must not end as done with its record gone."""
        missing = [
            rel
            for rel in (SPEC, _epoch_rel(self.epoch) if self.epoch else "")
            if rel and not self.exists(rel)
        ]
        if missing:
            raise StoreGone(
                f"the run store {self.run_uri} lost {' and '.join(missing)} while this attempt ran (deleted "
                "or replaced?); not finishing the run: its checkpoints and records may be gone"
            )

    # ---- spec ----------------------------------------------------------------------------------
    def write_spec(self, spec: dict[str, Any]) -> None:
        self.write_json(SPEC, spec)

    def read_spec(self) -> dict[str, Any]:
        return self.read_json(SPEC)


def output_store(output_uri: str, run_uri: str, storage_options: dict[str, Any] | None = None) -> RunStore:
    """Where ftorch writes a run's output or an export. Inside the run store (the default `output/`,
    `exports/`), links are judged against the run store: a linked `output/` is refused, never followed.
    A folder the user named elsewhere is guarded against links out of itself, like any store."""
    store = RunStore(output_uri, storage_options)
    if store.is_local:
        run_root = RunStore(run_uri, storage_options).root
        if os.path.abspath(store.root).startswith(os.path.abspath(run_root) + os.sep):
            store.within = run_root
    return store


def check_output(output_uri: str, run_uri: str, storage_options: dict[str, Any] | None = None) -> None:
    """Before training: LinkRefused (one line naming output) if the output folder is a link out of the
    run store, so that the trainer stops now (exit 2) instead of after the last step."""
    store = output_store(output_uri, run_uri, storage_options)
    try:
        store._guard(store.root)
    except LinkRefused as exc:
        raise LinkRefused(f"output: {exc}") from None


def _part_order(name: str) -> tuple[int, ...]:
    """`<attempt>-<part>.jsonl` in attempt order, then part order (numbers, not text)."""
    try:
        return tuple(int(n) for n in name.removesuffix(".jsonl").split("-"))
    except ValueError:
        return (-1,)


def _epoch_rel(epoch: int) -> str:
    return f"{FENCE}/{EPOCH_PREFIX}{epoch:08d}.json"


def _epoch_dir(epoch: int) -> str:
    """Where an epoch's checkpoint files go inside the step folder ('' for unfenced writers)."""
    return f"e{epoch:08d}" if epoch else ""


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)


def _POINTS_ACTIVE() -> bool:  # noqa: N802 - reads like the constant it stands for
    return bool(os.environ.get("FTORCH_FAULTS"))
