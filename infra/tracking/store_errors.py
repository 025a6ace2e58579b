"""MLflow's own store on a full disk, told apart from any other failure and named.

When logging to a run or ending it fails because the store (its SQLite file or its
artifacts) has no space left, the run's code gets a `StoreFullError`: an OSError with errno
ENOSPC that names the store and says what to do, instead of SQLite's bare "database or disk
is full" or an error about a file it never wrote.
"""
from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

from infra.tracking.redaction import redact
from infra.workspace.paths import Workspace


class StoreFullError(OSError):
    """MLflow's store is on a full disk: an OSError with errno ENOSPC whose message names the store."""


def _store_location(uri: str) -> str:
    """The store's file (a SQLite tracking URI), else the tracking URI with any credentials hidden."""
    if uri.startswith("sqlite:///"):
        return uri.removeprefix("sqlite:///")
    return redact("uri", uri)


def _is_store_full(exc: BaseException, ws: Workspace, stop: BaseException | None = None) -> bool:
    """Whether `exc` (or what caused it, up to `stop`) says MLflow's store ran out of space:
    SQLite's "database or disk is full", or ENOSPC/EDQUOT on a file of the store or its artifacts."""
    store_files = (ws.mlflow_db, ws.mlflow_artifacts)
    seen: BaseException | None = exc
    while seen is not None and seen is not stop:
        if "database or disk is full" in str(seen):
            return True
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT) and seen.filename:
            path = Path(os.fsdecode(seen.filename)).resolve()
            if any(path == f or f in path.parents for f in (Path(p).resolve() for p in store_files)):
                return True
        seen = seen.__cause__ or seen.__context__
    return False


def store_full_error(ws: Workspace, store_uri: str, run: Any, exc: BaseException, status: str | None = None,
                     after: BaseException | None = None) -> StoreFullError | None:
    """A StoreFullError when `exc` is MLflow's store running out of space, else None.

    `store_uri`: the tracking URI of the store (infra.tracking.store.tracking_uri), named in the message;
    `status`: the status `run` could not be given; `after`: the error the run's code raised first.
    """
    if isinstance(exc, StoreFullError) or not _is_store_full(exc, ws, stop=after):
        return None
    logging_failed = after is not None and _is_store_full(after, ws)
    if status is None:
        what = f"logging to run {run.info.run_id} failed"
    else:
        what = f"{'logging to run failed and ' if logging_failed else ''}run {run.info.run_id} could not be marked {status}"
    first = f"; the run had failed with: {after}" if after is not None and not logging_failed else ""
    return StoreFullError(errno.ENOSPC, f"MLflow's store at {_store_location(store_uri)} is on a full disk (No space left "
                                        f"on device): {what}{first}. Make room there (or point MLFLOW_TRACKING_URI "
                                        "at another store) and rerun")


# SQLite's words for a store that cannot be used, the CLI's exit code (flows/cli.py) and what to do.
_STORE_FAULTS = (
    ("database is locked", 3, "is locked by another process (database is locked): wait for the run or command "
                              "using it to finish"),
    ("readonly database", 3, "is read-only (attempt to write a readonly database): make it and its folder writable"),
    ("unable to open database file", 2, "cannot be opened (unable to open database file): its folder must exist "
                                        "or be creatable"),
    ("file is not a database", 2, "is not an SQLite database: move that file away"),
)


def quiet_store_tracebacks() -> None:
    """Stop MLflow logging the traceback of a store error it then raises anyway: `store_fault` says it in one line."""
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def store_fault(exc: BaseException, store_uri: str) -> tuple[int, str] | None:
    """(exit code, one line) when `exc` or its causes say MLflow's store is locked, read-only or cannot be
    opened (a missing folder, a file in its way, another file), else None."""
    where = f"MLflow's store at {_store_location(store_uri)}"
    fix = "; or point MLFLOW_TRACKING_URI at another store"
    db = Path(store_uri.removeprefix("sqlite:///")) if store_uri.startswith("sqlite:///") else None
    seen: BaseException | None = exc
    while seen is not None:
        # Only the store's own errors: a data file on a read-only disk is not the store's fault.
        if type(seen).__module__.split(".")[0] in ("sqlite3", "sqlalchemy", "mlflow"):
            text = str(seen).lower()
            for words, code, what in _STORE_FAULTS:
                if words in text:
                    return code, f"{where} {what}{fix}"
        # MLflow makes the store's folder first: a file in the way fails there, before SQLite.
        if (db is not None and isinstance(seen, (FileExistsError, NotADirectoryError)) and seen.filename
                and Path(os.fsdecode(seen.filename)) in (db, *db.parents)):
            return 2, f"{where} cannot be created: {os.fsdecode(seen.filename)} is a file, not a folder{fix}"
        seen = seen.__cause__ or seen.__context__
    return None
