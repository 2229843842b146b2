"""The acceptance's results on disk as they come: one JSON line per measurement, flushed and fsynced
before the next starts, so a run cut off by the device's time limit still leaves everything it
measured; a markdown table rendered from whatever the lines hold, after every part and at the end.

A record is `{"part", "what", "t_s", ...figures}`; a part's outcome is `{"part", "what": "status",
"status": ok | failed | skipped | timed out, ...}`, with the traceback of a failure."""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

JSONL = "results.jsonl"
MARKDOWN = "results.md"


class Recorder:
    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.path = out / JSONL
        self.start = time.monotonic()
        self._fh = self.path.open("w", encoding="utf-8")

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def write(self, part: str, what: str, **figures: Any) -> dict[str, Any]:
        row = {"part": part, "what": what, "t_s": round(self.elapsed(), 3), **figures}
        self._fh.write(json.dumps(row, default=_plain) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        return row

    def render(self) -> Path:
        """results.md from the lines on disk (what a later `--render` of the same file gives)."""
        md = self.out / MARKDOWN
        tmp = md.with_suffix(".tmp")
        tmp.write_text(render(read(self.path)), encoding="utf-8")
        tmp.replace(md)  # never half a table on disk
        return md

    def close(self) -> None:
        self._fh.close()


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy and torch scalars
        return value.item()
    return str(value)


def read(path: Path) -> list[dict[str, Any]]:
    """The records of a results file; a last line cut by a kill mid-write is left out."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class PartTimeout(Exception):
    pass


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise `PartTimeout` in the main thread after `seconds`, so one stuck part cannot eat the budget of
    those after it (a CUDA kernel is not interrupted: the exception arrives when Python runs again)."""

    def fire(signum: int, frame: Any) -> None:
        raise PartTimeout(f"the part ran past its {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_part(
    rec: Recorder, name: str, fn: Callable[[], None], planned_s: float, budget_s: float, always: bool = False
) -> str:
    """Run one part unless the budget cannot hold it (`always`: whatever is left, for the preflight,
    which then gets its planned time); its outcome is recorded whatever happens."""
    left = budget_s - rec.elapsed()
    if not always and left < planned_s:
        rec.write(name, "status", status="skipped", reason=f"budget: {left:.0f} s left of {budget_s:.0f}, the part is planned at {planned_s:.0f} s")  # fmt: skip
        return "skipped"
    t0 = time.monotonic()
    try:
        with deadline(max(left, planned_s)):
            fn()
    except Missing as exc:
        rec.write(name, "status", status="skipped", reason=str(exc), seconds=round(time.monotonic() - t0, 3))
        return "skipped"
    except PartTimeout as exc:
        rec.write(name, "status", status="timed out", reason=str(exc), traceback=traceback.format_exc())
        return "timed out"
    except Exception as exc:  # noqa: BLE001 — recorded with its traceback; the next part still runs
        rec.write(name, "status", status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())  # fmt: skip
        return "failed"
    rec.write(name, "status", status="ok", seconds=round(time.monotonic() - t0, 3))
    return "ok"


class Missing(Exception):
    """A part cannot run because what it needs is not there (an earlier part failed, trl is absent)."""


def render(rows: list[dict[str, Any]]) -> str:
    """One markdown table per part, in the order the parts ran, columns from the records' own keys."""
    lines = ["# GPU acceptance", ""]
    head = next((r for r in rows if r["part"] == "preflight" and r["what"] == "run"), None)
    gpu = next((r for r in rows if r["part"] == "preflight" and r["what"] == "gpu"), {})
    if head:
        device = gpu.get("name") or ("no GPU" if gpu else "device not probed yet")
        lines += [f"{device}, {head.get('scale', '?')} sizes, {head.get('date', '?')}", ""]
    parts: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        parts.setdefault(row["part"], []).append(row)
    lines += ["| part | status | seconds | note |", "|---|---|---|---|"]
    for part, records in parts.items():
        status = next((r for r in records if r["what"] == "status"), None)
        if status is None:
            lines.append(f"| {part} | (no outcome: cut off) | | |")
            continue
        note = status.get("reason") or status.get("error") or ""
        lines.append(f"| {part} | {status['status']} | {status.get('seconds', '')} | {_cell(note)} |")
    for part, records in parts.items():
        table = [r for r in records if r["what"] != "status"]
        if not table:
            continue
        lines += ["", f"## {part}"]
        shown: tuple[str, ...] = ()
        for r in table:  # a new table header wherever the records' fields change
            keys = tuple(k for k in r if k not in ("part", "traceback"))
            if keys != shown:
                lines += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
                shown = keys
            lines.append("| " + " | ".join(_cell(r[k]) for k in keys) + " |")
        for r in records:
            if r.get("traceback"):
                lines += ["", "```", r["traceback"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        value = json.dumps(value, default=str)
    return str(value).replace("|", "\\|").replace("\n", " ")
