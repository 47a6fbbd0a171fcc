"""Requests simulated so far by the samples in flight: what the progress bar's rate counts before they finish.

A streamed sample (:class:`mcsim.execution.sample.StreamedSample`) calls :func:`report` after each chunk of its
first pass; on a ``dask.distributed`` worker that is an event of :data:`TOPIC` with the task's key, which
:class:`InFlight` (subscribed on the client) adds up. A run without Dask (tasks in this process) listens with
:func:`listening`. Elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import sys
import threading

#: The event topic of the requests a task has simulated.
TOPIC = "mcsim-requests"


_listener = None  # a callable of the requests simulated so far by the task running in this process, or None
_counted = 0


@contextlib.contextmanager
def listening(callback):
    """Within the block, :func:`report` outside a Dask worker calls ``callback(requests so far in this task)``;
    the count restarts with each task (:func:`task_done`)."""
    global _listener, _counted
    _listener, _counted = callback, 0
    try:
        yield
    finally:
        _listener, _counted = None, 0


def task_done() -> None:
    """The task running in this process has finished: the next one counts from 0."""
    global _counted
    _counted = 0


def report(requests: int) -> None:
    """Count ``requests`` more simulated by the task this runs in (a no-op outside a dask worker, unless a run in
    this process is :func:`listening`)."""
    global _counted
    if _listener is not None and threading.current_thread() is threading.main_thread():
        _counted += int(requests)
        _listener(_counted)
        return
    distributed = sys.modules.get("distributed")
    if distributed is None:  # never imported: not in a worker (and importing it costs a second)
        return
    try:
        worker = distributed.get_worker()
    except ValueError:  # not in a worker
        return
    key = worker.get_current_task()
    if isinstance(key, str):
        worker.log_event(TOPIC, [key, int(requests)])


class InFlight:
    """Requests reported by each running task (the handler of :data:`TOPIC` events), less those of tasks done.

    ``per_task`` caps a task's count (its samples x requests) and ``weight`` divides what is reported: the
    variants of a sample, each of which streams its requests once. A variant that does not stream reports nothing,
    so the count in flight is then low by its share until the task is done (it is a display, not a result).
    """

    def __init__(self, per_task: dict, weight: int = 1):
        self.per_task, self.weight = per_task, max(int(weight), 1)
        self.counts: dict = {}
        self.done: set = set()
        self.lock = threading.Lock()

    def __call__(self, event) -> None:
        _, (key, requests) = event
        with self.lock:
            if key not in self.done:
                self.counts[key] = self.counts.get(key, 0) + int(requests)

    def finish(self, key) -> None:
        with self.lock:
            self.done.add(key)
            self.counts.pop(key, None)

    def requests(self) -> int:
        """Requests simulated by the running tasks."""
        with self.lock:
            return sum(min(n // self.weight, self.per_task.get(k, 0)) for k, n in self.counts.items())
