"""What a shard's refusal (SQLSTATE 40001) is, and the package's exceptions made with their
attributes: shared by the routers and by ``attempts`` (a transaction on the caller's own
connection)."""

from __future__ import annotations

from typing import Any

from . import _native


def error(cls: type[Exception], message: str, **attrs: object) -> Exception:
    """An exception of the package's, with its attributes (``retryable`` among them)."""
    e = cls(message)
    for name, value in attrs.items():
        setattr(e, name, value)
    return e


def refusal(e: Any) -> tuple[str, str | None] | None:
    """The SQLSTATE and DETAIL of a psycopg error ``e`` when it is a refusal (40001)."""
    if getattr(e, "sqlstate", None) != "40001":
        return None
    return e.sqlstate, e.diag.message_detail


def unstamped(e: Any) -> bool:
    """Whether the refusal ``e`` says a statement ran with no stamp (``missing``): after a
    stamped transaction began, only a block that ended it (a COMMIT of its own, a second
    transaction) gets that; re-running the block would commit its first part again."""
    return _native.refusal_reason(e.sqlstate or "", e.diag.message_detail) == "missing"


def _aborted(entity: tuple[str, str], shard: str, message: str) -> Exception:
    """``Aborted`` (not retryable) of the routed transaction of ``entity`` on ``shard``."""
    return error(
        _native.Aborted,
        f"{entity[0]}/{entity[1]}: {message}",
        entity_type=entity[0],
        entity_id=entity[1],
        shard=shard,
        retryable=False,
    )


def left_the_transaction(entity: tuple[str, str], shard: str, how: str) -> Exception:
    """The block ended the routed transaction itself (``how``): what it committed stays, and
    the rest is not re-run (it would commit that again)."""
    return _aborted(
        entity,
        shard,
        f"the block {how} on shard \"{shard}\", outside the routed transaction: what it "
        "committed before stays committed, the rest was not re-run",
    )


def caught_and_aborted(entity: tuple[str, str], shard: str) -> Exception:
    """An error the block caught aborted the routed transaction: COMMIT would roll it back."""
    return _aborted(
        entity,
        shard,
        f"the transaction on shard \"{shard}\" was aborted by an error the application "
        "caught; it was rolled back, nothing was committed",
    )


def rejected(route: _native.Route, e: Any, entity: tuple[str, str]) -> Exception:
    """The refusal ``e`` the core gave up on, as ``Rejected``."""
    reason = _native.refusal_reason(e.sqlstate or "", e.diag.message_detail)
    r = error(
        _native.Rejected,
        f"{entity[0]}/{entity[1]}: shard refused the transaction {route.attempt} times, "
        f"last as {reason} ({e.diag.message_primary})",
        entity_type=entity[0],
        entity_id=entity[1],
        shard=route.entry.shard_name,
        reason=reason,
        attempts=route.attempt,
        retryable=True,
    )
    r.__cause__ = e
    return r
