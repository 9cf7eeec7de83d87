"""Why a run failed, in the one line an operator reads: the demo's, the failure record's, the webhook's.

A refusal (the brake, a bad policy, a database out of reach) is raised as a ``dg.Failure`` whose description
is already that line. Anything else is the innermost error of the chain Dagster serialized (its own wrappers,
"Exceeded max_retries", "Error executing resource_fn", come first), as ``ErrorClass: message``. A run that
failed outside any step (a resource that would not initialize, a worker lost) has its cause on the run's
failure event, not on a step's. A run that never started (the run queue could not launch it: the code server
did not answer in time) has a failure event that says only :data:`FAILED_FROM_OUTSIDE`: its cause is the error
Dagster recorded, as an engine event, while launching it (:func:`launch_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    return _class_and_message(innermost(error))


def _class_and_message(error: SerializableErrorInfo) -> str:
    name = (error.cls_name or "").rsplit(".", 1)[-1]
    message = error.message.strip()
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


#: The whole message of the failure event of a run the run queue failed at launch: says nothing of why.
FAILED_FROM_OUTSIDE = "This run has been marked as failed from outside the execution context."


@dataclass(frozen=True)
class Launch:
    """What a run's event log says of its launch, up to its failure: whether it started, and if it never did, the
    errors Dagster recorded launching it (the run queue's, the call to the code server's), oldest first."""

    started: bool
    errors: tuple[SerializableErrorInfo, ...] = ()


def launch_of(instance: dg.DagsterInstance, run_id: str) -> Launch:
    """The launch of run ``run_id``, from the engine events before its failure (later ones, e.g. a retry that could not
    be created, are not about its launch)."""
    types = {dg.DagsterEventType.ENGINE_EVENT, dg.DagsterEventType.RUN_START, dg.DagsterEventType.RUN_FAILURE}
    errors: list[SerializableErrorInfo] = []
    for entry in instance.all_logs(run_id, of_type=types):
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type == dg.DagsterEventType.RUN_START:
            return Launch(started=True)
        if event.event_type == dg.DagsterEventType.RUN_FAILURE:
            break
        if event.engine_event_data.error is not None:
            errors.append(event.engine_event_data.error)
    return Launch(started=False, errors=tuple(errors))


def launch_error_line(errors: Sequence[SerializableErrorInfo]) -> str:
    """``launch failed: ErrorClass: message``, each distinct error once. The error Dagster raised, not its innermost:
    under a ``DagsterUserCodeUnreachableError`` lies the gRPC call's own dump."""
    return one_line("launch failed: " + "; ".join(dict.fromkeys(_class_and_message(error) for error in errors)))


def run_cause(
    run_failure: dg.DagsterEvent | None,
    step_failures: Sequence[dg.DagsterEvent],
    launch_errors: Sequence[SerializableErrorInfo] = (),
) -> str:
    """Why a run failed: the causes of its failed steps (each once), else the run failure's own error, else its message
    with the errors of a launch that never started the run (:class:`Launch`) in place of Dagster's
    :data:`FAILED_FROM_OUTSIDE`, or after any other message (run monitoring's start timeout)."""
    causes = list(dict.fromkeys(step_cause(event) for event in step_failures))
    if causes:
        return "; ".join(causes)
    message = ""
    if run_failure is not None:
        error = getattr(run_failure.event_specific_data, "error", None)
        if error is not None:
            return error_line(error)
        message = one_line(run_failure.message or "")
    if launch_errors:
        launch = launch_error_line(launch_errors)
        return launch if message in ("", FAILED_FROM_OUTSIDE) else one_line(f"{message} ({launch})")
    return message or "the run failed before its first step (see the run's events in the Dagster UI)"


def result_cause(result: dg.ExecuteInProcessResult) -> str:
    """:func:`run_cause` of a run executed in this process."""
    events = result.all_events
    run_failure = next((event for event in events if event.event_type == dg.DagsterEventType.RUN_FAILURE), None)
    return run_cause(run_failure, [event for event in events if event.is_step_failure])
