"""The thresholds and limits of a cleanup, validated before anything is read or written."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from zombie_pipeline.documents import CACHE_GENERATIONS, DEFAULT_ZOMBIE_HTTP_STATUS, ErrorCode


class PolicyError(ValueError):
    """A policy value is out of range; the message names the field."""


@dataclass(frozen=True)
class ZombiePolicy:
    heartbeat_timeout_seconds: int = 300
    max_duration_seconds: int = 1200
    max_duration_seconds_by_type: dict[str, int] = field(default_factory=dict)
    max_stale_fraction: float = 0.5
    min_started_for_brake: int = 20
    crashed_retry_limit: int = 3
    exceeded_retry_limit: int = 0
    http_status: int = DEFAULT_ZOMBIE_HTTP_STATUS
    batch_size: int = 500
    claim_lease_seconds: int = 300
    cache_generation: str | None = None  # None: detect from the existing entries

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise PolicyError("invalid zombie policy: " + "; ".join(problems))

    def problems(self) -> list[str]:
        problems = []

        def positive(name: str, value: Any) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {value!r}")

        def non_negative(name: str, value: Any) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{name} must be a non-negative integer, got {value!r}")

        positive("heartbeat_timeout_seconds", self.heartbeat_timeout_seconds)
        positive("max_duration_seconds", self.max_duration_seconds)
        positive("batch_size", self.batch_size)
        non_negative("claim_lease_seconds", self.claim_lease_seconds)
        non_negative("min_started_for_brake", self.min_started_for_brake)
        non_negative("crashed_retry_limit", self.crashed_retry_limit)
        non_negative("exceeded_retry_limit", self.exceeded_retry_limit)
        timeout = self.heartbeat_timeout_seconds
        limits = {"max_duration_seconds": self.max_duration_seconds} | {
            f"max_duration_seconds_by_type[{job_type!r}]": value
            for job_type, value in self.max_duration_seconds_by_type.items()
        }
        for name, value in limits.items():
            if name != "max_duration_seconds":
                positive(name, value)
            if isinstance(value, int) and isinstance(timeout, int) and 0 < value < timeout:
                problems.append(
                    f"{name} ({value} s) is shorter than heartbeat_timeout_seconds ({timeout} s): "
                    "a job would be killed for running long before a missing heartbeat could be seen"
                )
        for job_type in self.max_duration_seconds_by_type:
            if not isinstance(job_type, str) or not job_type:
                problems.append(f"max_duration_seconds_by_type has an empty or non-string job type: {job_type!r}")
        if not isinstance(self.max_stale_fraction, (int, float)) or not 0 < self.max_stale_fraction <= 1:
            problems.append(f"max_stale_fraction must be in (0, 1], got {self.max_stale_fraction!r}")
        if not isinstance(self.http_status, int) or not 400 <= self.http_status <= 599:
            problems.append(f"http_status must be an HTTP error status (400-599), got {self.http_status!r}")
        if self.cache_generation is not None and self.cache_generation not in CACHE_GENERATIONS:
            problems.append(
                f"cache_generation must be one of {sorted(CACHE_GENERATIONS)} or unset, got {self.cache_generation!r}"
            )
        return problems

    def max_duration_of(self, job_type: str) -> int:
        return self.max_duration_seconds_by_type.get(job_type, self.max_duration_seconds)

    def retry_limit_of(self, error_code: str) -> int:
        if error_code == ErrorCode.EXCEEDED_MAX_DURATION:
            return self.exceeded_retry_limit
        return self.crashed_retry_limit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
