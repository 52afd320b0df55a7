"""Reports: totals and summaries computed from a journal."""

from __future__ import annotations

from collections import defaultdict
from datetime import date

from ledger.transactions import Journal


def format_cents(amount_cents: int) -> str:
    """Return an amount in cents as text, e.g. 123456 -> '1,234.56'."""
    sign = "-" if amount_cents < 0 else ""
    whole, cents = divmod(abs(amount_cents), 100)
    return f"{sign}{whole:,}.{cents:02d}"


def total_in_cents(journal: Journal, account_id: str) -> int:
    """Return the money that came into one account, in cents."""
    return sum(t.amount_cents for t in journal.transactions_for_account(account_id) if t.target_id == account_id)


def total_out_cents(journal: Journal, account_id: str) -> int:
    """Return the money that left one account, in cents."""
    return sum(t.amount_cents for t in journal.transactions_for_account(account_id) if t.source_id == account_id)


def monthly_totals_cents(journal: Journal, account_id: str) -> dict[tuple[int, int], int]:
    """Return the net movement of one account per (year, month), in cents."""
    totals: dict[tuple[int, int], int] = defaultdict(int)
    for t in journal.transactions_for_account(account_id):
        key = (t.day.year, t.day.month)
        if t.target_id == account_id:
            totals[key] += t.amount_cents
        if t.source_id == account_id:
            totals[key] -= t.amount_cents
    return dict(totals)


def statement_lines(journal: Journal, account_id: str, first: date, last: date) -> list[str]:
    """Return one line per transaction of one account between two days, oldest first."""
    lines = []
    for t in journal.transactions_between(first, last):
        if account_id not in (t.source_id, t.target_id):
            continue
        sign = "+" if t.target_id == account_id else "-"
        lines.append(f"{t.day.isoformat()}  {sign}{format_cents(t.amount_cents):>12}  {t.memo}")
    return lines
