"""Metadata values shared by the ops and checks."""

from typing import Any

import dagster as dg


def table_metadata(rows: list[dict[str, Any]]) -> dg.TableMetadataValue:
    """Rows of plain values as a table the UI renders inline (None shows as an empty cell)."""
    if not rows:
        return dg.MetadataValue.table([], schema=dg.TableSchema(columns=[dg.TableColumn("id", "string")]))
    columns = list(rows[0])
    records = [dg.TableRecord({name: _cell(row.get(name)) for name in columns}) for row in rows]
    schema = dg.TableSchema(columns=[dg.TableColumn(name, _column_type(rows[0].get(name))) for name in columns])
    return dg.MetadataValue.table(records, schema=schema)


def _cell(value: Any) -> Any:
    return "" if value is None else value


def _column_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "string"
