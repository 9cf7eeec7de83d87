"""Metadata values shared by the ops, assets and checks."""

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

import dagster as dg


def table_metadata(rows: list[dict[str, Any]]) -> dg.TableMetadataValue:
    """Rows of plain values as a table the UI renders inline (None shows as an empty cell)."""
    if not rows:
        return dg.MetadataValue.table([], schema=dg.TableSchema(columns=[dg.TableColumn("job_id", "string")]))
    columns = list(rows[0])
    records = [dg.TableRecord({name: _cell(row.get(name)) for name in columns}) for row in rows]
    schema = dg.TableSchema(columns=[dg.TableColumn(name, _column_type(rows[0].get(name))) for name in columns])
    return dg.MetadataValue.table(records, schema=schema)


def counts_metadata(counts: Mapping[str, int]) -> dict[str, int]:
    """Step counts as metadata entries (``reason:x`` becomes ``reason/x``: the UI groups them)."""
    return {name.replace(":", "/"): count for name, count in sorted(counts.items())}


def malformed_metadata(malformed: Iterable[Any], limit: int | None = None) -> dict[str, Any]:
    """How many started jobs were left alone as malformed, and which, with their problem."""
    malformed = list(malformed)
    metadata: dict[str, Any] = {"malformed_skipped": len(malformed)}
    if malformed:
        metadata["malformed_jobs"] = dg.MetadataValue.json(
            [{"id": str(item.id), "problem": item.problem} for item in malformed[:limit]]
        )
    return metadata


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    return value.value if isinstance(value, Enum) else value  # Dagster serializes plain values only


def _column_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "string"
