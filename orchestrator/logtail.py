"""Reading a log file that another process is still writing: new whole lines since the last read, or
the last few lines. The one log tailer (`ftorch logs`, `--follow`, the live view, the supervisor)."""

from __future__ import annotations

from pathlib import Path


class LogTail:
    """Follows one file by byte offset; a line is returned once, when its newline has been written."""

    def __init__(self, path: Path | str, offset: int = 0) -> None:
        self.path = Path(path)
        #: bytes already read (start later to skip what was there before)
        self.offset = offset
        self._partial = b""

    def read_lines(self, final: bool = False) -> list[str]:
        """The lines completed since the last call ([] while the file does not exist). `final`: also the
        unterminated last line (the writer has stopped)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
                self.offset = handle.tell()
        except FileNotFoundError:
            chunk = b""
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        return [line.decode("utf-8", "replace") for line in lines]

    def last_lines(self, n: int, max_bytes: int = 8192) -> list[str]:
        """The last `n` non-blank lines within the file's last `max_bytes` (independent of reading)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(0, 2)
                handle.seek(max(0, handle.tell() - max_bytes))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-n:]
