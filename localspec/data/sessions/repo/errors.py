"""Errors raised by the ledger package."""


class LedgerError(Exception):
    """Base class for every ledger error."""


class UnknownAccountError(LedgerError, KeyError):
    """An account id that the ledger does not hold."""


class InsufficientFundsError(LedgerError, ValueError):
    """A withdrawal or transfer larger than the balance."""
