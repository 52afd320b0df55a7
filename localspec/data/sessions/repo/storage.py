"""Storage: save and load a ledger as JSON."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from ledger.accounts import Account, AccountBook
from ledger.errors import LedgerError
from ledger.transactions import Journal, Transaction


def journal_to_dict(journal: Journal) -> dict:
    """Return a JSON-ready dict of every account and transaction."""
    return {
        "accounts": [
            {"account_id": a.account_id, "owner": a.owner, "balance_cents": a.balance_cents, "tags": a.tags}
            for a in journal.book._accounts.values()
        ],
        "transactions": [
            {
                "day": t.day.isoformat(),
                "amount_cents": t.amount_cents,
                "source_id": t.source_id,
                "target_id": t.target_id,
                "memo": t.memo,
            }
            for t in journal.transactions
        ],
    }


def save_journal(journal: Journal, path: Path) -> None:
    """Write a journal to ``path`` as JSON (atomically: a temporary file, then a rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(journal_to_dict(journal), indent=2), encoding="utf-8")
    tmp.replace(path)


def load_journal(path: Path) -> Journal:
    """Read a journal written by save_journal, or raise LedgerError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise LedgerError(f"{path}: cannot read the ledger ({exc})") from None
    book = AccountBook()
    for row in data["accounts"]:
        account = Account(row["account_id"], row["owner"], row["balance_cents"], list(row["tags"]))
        book._accounts[account.account_id] = account
    journal = Journal(book)
    for row in data["transactions"]:
        journal.transactions.append(
            Transaction(
                date.fromisoformat(row["day"]),
                row["amount_cents"],
                row["source_id"],
                row["target_id"],
                row["memo"],
            )
        )
    return journal
