"""Transactions: every movement of money, kept in order."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from ledger.accounts import AccountBook


@dataclass(frozen=True)
class Transaction:
    """One movement of money between two accounts (either may be None for cash)."""

    day: date
    amount_cents: int
    source_id: str | None
    target_id: str | None
    memo: str = ""


class Journal:
    """The ordered list of transactions, applied to an account book."""

    def __init__(self, book: AccountBook) -> None:
        self.book = book
        self.transactions: list[Transaction] = []

    def record_deposit(self, day: date, account_id: str, amount_cents: int, memo: str = "") -> Transaction:
        """Deposit cash into an account and record it."""
        self.book.deposit_cents(account_id, amount_cents)
        transaction = Transaction(day, amount_cents, None, account_id, memo)
        self.transactions.append(transaction)
        return transaction

    def record_transfer(
        self, day: date, source_id: str, target_id: str, amount_cents: int, memo: str = ""
    ) -> Transaction:
        """Move money between two accounts and record it."""
        self.book.withdraw_cents(source_id, amount_cents)
        self.book.deposit_cents(target_id, amount_cents)
        transaction = Transaction(day, amount_cents, source_id, target_id, memo)
        self.transactions.append(transaction)
        return transaction

    def transactions_for_account(self, account_id: str) -> list[Transaction]:
        """Return every transaction that touched one account, oldest first."""
        return [t for t in self.transactions if account_id in (t.source_id, t.target_id)]

    def transactions_between(self, first: date, last: date) -> list[Transaction]:
        """Return the transactions from ``first`` to ``last`` inclusive, oldest first."""
        return [t for t in self.transactions if first <= t.day <= last]
