"""msgspec helpers for the event log: record tagged Structs as JSON lines, read them back."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar, overload

import msgspec

__all__ = ["EventRecorder", "EventSink", "EventTee", "iter_events", "read_events"]

T = TypeVar("T")


class EventSink(Protocol):
    """Anything that takes lifecycle events one by one (:class:`EventRecorder`, a trace
    recorder); the KV-manager actor hands it every event it handles."""

    def record(self, event: msgspec.Struct) -> None: ...


class EventTee:
    """Hand each event to several sinks, in order (e.g. an event log and a trace recorder)."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = sinks

    def record(self, event: msgspec.Struct) -> None:
        """Pass ``event`` to every sink."""
        for sink in self.sinks:
            sink.record(event)


class EventRecorder:
    """Append tagged, frozen msgspec Structs to a JSON-lines file, one event per line.

    Writes are synchronous and buffered; :meth:`close` (or leaving the ``with`` block) flushes.
    The file is opened in append mode, so a recording can be resumed.

    Args:
        path: the JSONL file to append to (e.g. the ``--record events.jsonl`` argument).

    Attributes:
        path: the file being written.
        recorded: how many events this recorder has written.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.recorded = 0
        self._encoder = msgspec.json.Encoder()
        self._file = self.path.open("ab")

    def record(self, event: msgspec.Struct) -> None:
        """Append ``event`` as one JSON line.

        Args:
            event: an instance of a tagged, frozen ``msgspec.Struct``.

        Raises:
            TypeError: if ``event`` is not a tagged, frozen Struct.
            ValueError: if the recorder is closed.
        """
        _check_event(event)
        if self._file.closed:
            raise ValueError(f"EventRecorder for {self.path} is closed")
        self._file.write(self._encoder.encode(event) + b"\n")
        self.recorded += 1

    def flush(self) -> None:
        """Write buffered events to the file."""
        self._file.flush()

    def close(self) -> None:
        """Flush and close the file. Idempotent."""
        self._file.close()

    def __enter__(self) -> EventRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _check_event(event: object) -> None:
    if not isinstance(event, msgspec.Struct):
        raise TypeError(f"event must be a msgspec.Struct, got {type(event).__name__}")
    config = type(event).__struct_config__
    if config.tag is None or not config.frozen:
        raise TypeError(
            f"event type {type(event).__name__} must be a tagged, frozen Struct "
            "(class ...(msgspec.Struct, tag=True, frozen=True))"
        )


@functools.cache
def _decoder(event_type: Any) -> msgspec.json.Decoder[Any]:
    """Return the JSON decoder for ``event_type``, built once per type and reused."""
    return msgspec.json.Decoder(event_type)


@overload
def iter_events(path: str | os.PathLike[str], event_type: type[T]) -> Iterator[T]: ...
@overload
def iter_events(path: str | os.PathLike[str], event_type: Any) -> Iterator[Any]: ...
def iter_events(path: str | os.PathLike[str], event_type: Any) -> Iterator[Any]:
    """Yield the events of a JSONL file one at a time, decoded as ``event_type``.

    Blank lines are skipped.

    Args:
        path: the JSONL file.
        event_type: a Struct class, or a union of tagged Struct classes.

    Yields:
        The decoded events, in file order.

    Raises:
        ValueError: if a line does not decode as ``event_type``; the message names the file
            and the 1-based line number.
    """
    decoder = _decoder(event_type)
    with Path(path).open("rb") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                yield decoder.decode(line)
            except msgspec.MsgspecError as error:
                raise ValueError(f"{path}: line {line_number}: {error}") from error


@overload
def read_events(path: str | os.PathLike[str], event_type: type[T]) -> list[T]: ...
@overload
def read_events(path: str | os.PathLike[str], event_type: Any) -> list[Any]: ...
def read_events(path: str | os.PathLike[str], event_type: Any) -> list[Any]:
    """Read all events of a JSONL file, decoded as ``event_type``.

    Args:
        path: the JSONL file.
        event_type: a Struct class, or a union of tagged Struct classes.

    Returns:
        The decoded events, in file order.

    Raises:
        ValueError: if a line does not decode as ``event_type``; the message names the file
            and the 1-based line number.
    """
    return list(iter_events(path, event_type))
