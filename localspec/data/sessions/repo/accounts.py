"""Accounts: an id, an owner and a balance in cents."""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.errors import InsufficientFundsError, UnknownAccountError


@dataclass
class Account:
    """One account. Amounts are integers in cents, never floats."""

    account_id: str
    owner: str
    balance_cents: int = 0
    tags: list[str] = field(default_factory=list)


class AccountBook:
    """Every account of the ledger, by id."""

    def __init__(self) -> None:
        self._accounts: dict[str, Account] = {}

    def open_account(self, account_id: str, owner: str) -> Account:
        """Create an account with a zero balance and return it."""
        if account_id in self._accounts:
            raise ValueError(f"account {account_id!r} already exists")
        account = Account(account_id=account_id, owner=owner)
        self._accounts[account_id] = account
        return account

    def get_account(self, account_id: str) -> Account:
        """Return the account with this id, or raise UnknownAccountError."""
        try:
            return self._accounts[account_id]
        except KeyError:
            raise UnknownAccountError(account_id) from None

    def deposit_cents(self, account_id: str, amount_cents: int) -> int:
        """Add money to an account and return the new balance in cents."""
        if amount_cents <= 0:
            raise ValueError(f"amount must be positive, got {amount_cents}")
        account = self.get_account(account_id)
        account.balance_cents += amount_cents
        return account.balance_cents

    def withdraw_cents(self, account_id: str, amount_cents: int) -> int:
        """Take money from an account and return the new balance in cents."""
        if amount_cents <= 0:
            raise ValueError(f"amount must be positive, got {amount_cents}")
        account = self.get_account(account_id)
        if amount_cents > account.balance_cents:
            raise InsufficientFundsError(f"account {account_id!r} holds {account.balance_cents} cents")
        account.balance_cents -= amount_cents
        return account.balance_cents

    def accounts_for_owner(self, owner: str) -> list[Account]:
        """Return every account of one owner, sorted by id."""
        return sorted(
            (a for a in self._accounts.values() if a.owner == owner), key=lambda a: a.account_id
        )
