"""Why a run failed, in the one line an operator reads: the demo's, the failure record's, the webhook's.

A refusal (the brake, a bad policy, a database out of reach) is raised as a ``dg.Failure`` whose description
is already that line. Anything else is the innermost error of the chain Dagster serialized (its own wrappers,
"Exceeded max_retries", "Error executing resource_fn", come first), as ``ErrorClass: message``. A run that
failed outside any step (a resource that would not initialize, a worker lost) has its cause on the run's
failure event, not on a step's.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
from dagster_shared.error import SerializableErrorInfo

#: The longest cause kept: a line, not a dump.
MAX_CAUSE_CHARS = 1_000


def one_line(text: str) -> str:
    """``text`` on one line: every run of whitespace, newlines included, becomes one space."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_CAUSE_CHARS else flat[: MAX_CAUSE_CHARS - 1] + "…"


def innermost(error: SerializableErrorInfo) -> SerializableErrorInfo:
    """The error at the bottom of ``error``'s chain (``raise ... from`` first, then the one being handled)."""
    while error.cause is not None or error.context is not None:
        error = error.cause or error.context  # type: ignore[assignment]
    return error


def error_line(error: SerializableErrorInfo) -> str:
    """``ErrorClass: message`` of the innermost error, on one line (Dagster prefixes the message with the module)."""
    bottom = innermost(error)
    name = (bottom.cls_name or "").rsplit(".", 1)[-1]
    message = bottom.message.strip()
    qualified, _, rest = message.partition(": ")
    if rest and qualified.rsplit(".", 1)[-1] == name:
        message = rest
    return one_line(f"{name}: {message}" if name and not message.startswith(name) else message)


def step_cause(event: dg.DagsterEvent) -> str:
    """Why a step failed: its ``dg.Failure``'s description, else its innermost error."""
    data = event.step_failure_data
    if data.user_failure_data is not None and data.user_failure_data.description:
        return one_line(data.user_failure_data.description)
    if data.error is not None:
        return error_line(data.error)
    return f"step {event.step_key} failed"


def run_cause(run_failure: dg.DagsterEvent | None, step_failures: Sequence[dg.DagsterEvent]) -> str:
    """Why a run failed: the causes of its failed steps (each once), else the run failure's own error or message."""
    causes = list(dict.fromkeys(step_cause(event) for event in step_failures))
    if causes:
        return "; ".join(causes)
    if run_failure is not None:
        error = getattr(run_failure.event_specific_data, "error", None)
        if error is not None:
            return error_line(error)
        if run_failure.message:
            return one_line(run_failure.message)
    return "the run failed before its first step (see the run's events in the Dagster UI)"


def result_cause(result: dg.ExecuteInProcessResult) -> str:
    """:func:`run_cause` of a run executed in this process."""
    events = result.all_events
    run_failure = next((event for event in events if event.event_type == dg.DagsterEventType.RUN_FAILURE), None)
    return run_cause(run_failure, [event for event in events if event.is_step_failure])
