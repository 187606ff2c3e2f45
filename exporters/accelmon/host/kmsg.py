"""The kernel log, as a host library (as procfs is): the records of /dev/kmsg (or of a file in its format, for tests
and for a log saved elsewhere), read from where the previous call stopped, lost and malformed records counted.
The kernel's dev-kmsg documentation: each read(2) of the character device returns one record and fails with EINVAL
when the buffer is smaller than the record (so it is read with a large buffer), EPIPE when records were overwritten
since the last read (the next read gives the oldest one left, its sequence number says how many were lost).
Each record carries its facility (PRIORITY >> 3): only the kernel's own messages have KERNEL_FACILITY, so a
reader that trusts a message (an XID) can tell them from text written into the log from userspace.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Callable, NamedTuple, Optional

# A record of /dev/kmsg is at most 8 KiB of text (the kernel's CONSOLE_EXT_LOG_MAX); a longer line in a file is
# not a kernel record.
MAX_RECORD = 16 * 1024
MAX_RECORDS_PER_SAMPLE = 100_000  # a flood is read over several samples, never in one unbounded loop


# LOG_KERN, the facility of what the kernel itself logs. Userspace cannot write a record with it: the kernel's
# devkmsg_write (kernel/printk/printk.c) logs a write to /dev/kmsg as LOG_USER (1) unless its `<N>` prefix names
# another non-zero facility ("we enforce LOG_USER, to be able to reliably distinguish kernel-generated messages
# from userspace-injected ones").
KERNEL_FACILITY = 0


class Record(NamedTuple):
    sequence: int
    microseconds: int  # since boot
    facility: int  # KERNEL_FACILITY for the kernel's own messages
    # The text before the record's KEY=value lines. /dev/kmsg escapes control characters in it (\xNN): a newline
    # the kernel was given to log cannot start a record of its own.
    message: str


def parse_record(text: str) -> Optional[Record]:
    """One kmsg record (`PRIORITY,SEQUENCE,MICROSECONDS,FLAGS[,...];MESSAGE`), None if it is not one."""
    prefix, sep, message = text.partition(";")
    fields = prefix.split(",")
    if not sep or len(fields) < 4 or not all(field.isascii() and field.isdigit() for field in fields[:3]):
        return None
    return Record(int(fields[1]), int(fields[2]), int(fields[0]) >> 3, message.split("\n", 1)[0])


class KernelLog:
    """Records of the kernel log at `path`, from where the previous call stopped; EPIPE and sequence gaps are
    counted as lost. A character device (/dev/kmsg) gives one record per read; a regular file is read by line."""

    def __init__(self, path: str, read: Callable[[int, int], bytes] = os.read) -> None:
        self.path = path
        self._read = read  # os.read; tests pass a scripted one to play the kernel's EPIPE and EINVAL
        self.lost = 0
        self.malformed = 0
        self._fd: Optional[int] = None
        self._device = False
        self._pending = b""  # a file's last line, not yet ended
        self._skipping = False  # inside a line too long to be a record: dropped up to its end
        self._position = 0
        self._next_sequence: Optional[int] = None

    def open(self) -> None:
        """Raises OSError (PermissionError included) if the log cannot be opened."""
        if self._fd is None:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._device = stat.S_ISCHR(os.fstat(fd).st_mode)
            self._fd, self._position, self._pending = fd, 0, b""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def records(self, limit: int = MAX_RECORDS_PER_SAMPLE) -> list[Record]:
        """What the log has that was not read yet (at most `limit` records)."""
        self.open()
        raw = self._read_device(limit) if self._device else self._read_file(limit)
        out = []
        for text in raw:
            record = parse_record(text)
            if record is None:
                self.malformed += 1
                continue
            if self._next_sequence is not None and record.sequence > self._next_sequence:
                self.lost += record.sequence - self._next_sequence
            self._next_sequence = record.sequence + 1
            out.append(record)
        return out

    def _read_device(self, limit: int) -> list[str]:
        assert self._fd is not None
        texts: list[str] = []
        while len(texts) < limit:
            try:
                chunk = self._read(self._fd, 8192)
            except BlockingIOError:
                break  # nothing more for now
            except BrokenPipeError:
                continue  # records were overwritten; the next read gives the oldest left (its sequence tells)
            except OSError as error:
                if error.errno != errno.EINVAL:
                    raise
                self.malformed += 1  # a record longer than our buffer: the kernel skips it on the next read
                continue
            if not chunk:
                break
            texts.append(chunk.decode("utf-8", errors="replace"))
        return texts

    def _read_file(self, limit: int) -> list[str]:
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < self._position:  # truncated or replaced: read it again from the start
            self._position, self._pending, self._next_sequence = 0, b"", None
        texts: list[str] = []
        while len(texts) < limit:
            chunk = os.pread(self._fd, 65536, self._position)
            if not chunk:
                break
            self._position += len(chunk)
            if self._skipping:
                end = chunk.find(b"\n")
                if end < 0:
                    continue
                chunk, self._skipping = chunk[end + 1 :], False
            lines = (self._pending + chunk).split(b"\n")
            self._pending = lines.pop()
            if len(self._pending) > MAX_RECORD:
                self.malformed += 1
                self._pending, self._skipping = b"", True
            for line in lines:
                if line.startswith(b" ") or not line:
                    continue  # a continuation line (KEY=value) of the record before, or an empty one
                if len(line) > MAX_RECORD:
                    self.malformed += 1
                    continue
                texts.append(line.decode("utf-8", errors="replace"))
        return texts
