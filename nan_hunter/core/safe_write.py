"""Every file nan-hunter writes goes through here: written whole or not at all, never lost.

``write_file`` writes a temporary file in the target's own folder, fsyncs it, renames it over
the target and fsyncs the folder: a full disk, a crash or Ctrl-C leaves either the old file or the
new one, never a truncated mix. An existing target keeps its permission bits and, when we run as
root, its owner. ``replace_with_backup`` (``--fix``) first writes the current source to a new
backup (``FILE.orig``, or ``FILE.orig.1``, ``FILE.orig.2``... when that name is taken: an existing
backup is never trusted nor overwritten), fsynced and checked byte for byte, and only then
replaces the source. ``write_new_folder`` (``run``'s reproduction bundle) writes a whole
folder beside its target and renames it there when complete, never over a folder that holds
anything. Failures raise ``WriteError`` with one line naming the file; nothing was
changed then.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from nan_hunter.errors import NanHunterError

MAX_BACKUPS = 1000
"""``FILE.orig`` then ``FILE.orig.1`` ... ``FILE.orig.999``: more than that is refused."""


class WriteError(NanHunterError):
    """A file could not be written; the target is unchanged."""


def refuse_overwrite(
    output: Path | str | None, patch: Path | str | None, protected: Mapping[str, str]
) -> None:
    """The one rule of what ``scan`` and ``run`` may write their report (``output``) and patch
    to: never a file the command reads or the model's code imported or wrote (``protected``:
    real path -> what it is, e.g. "the script"), and never one file for both. Raises a
    ``NanHunterError`` naming the file and what it is."""
    targets = [(output, "report"), (patch, "patch")]
    reals = [os.path.realpath(t) if t is not None else None for t, _ in targets]
    if reals[0] is not None and reals[0] == reals[1]:
        raise NanHunterError(
            f"refusing to write the report and the patch to one file ({output}): "
            "choose two files"
        )
    for (target, what), real in zip(targets, reals, strict=True):
        if real is not None and real in protected:
            raise NanHunterError(
                f"refusing to write the {what} to {target}: it is {protected[real]}; "
                "choose another file"
            )


def write_file(path: Path, data: str | bytes, *, encoding: str = "utf-8") -> None:
    """Replace (or create) ``path`` with ``data`` atomically and durably."""
    payload = data.encode(encoding) if isinstance(data, str) else data
    path = Path(path)
    if path.is_symlink():  # write the file the link points to; the link stays a link
        path = Path(os.path.realpath(path))
    existing = _stat_or_none(path)
    if existing is not None and (stat.S_ISCHR(existing.st_mode) or stat.S_ISFIFO(existing.st_mode)):
        _write_stream(path, payload)  # /dev/stdout, /dev/null, a named pipe: no file to replace
        return
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise WriteError(f"cannot write {path}: not a regular file")
    if existing is not None and _read_only(path, existing):
        raise WriteError(f"cannot write {path}: the file is read-only")
    temp = _write_temp(path, payload, like=existing)
    try:
        os.replace(temp, path)
    except OSError as exc:
        _remove(temp)
        raise WriteError(f"cannot write {path}: {_why(exc)}") from exc
    _fsync_folder(path.parent)


def replace_with_backup(path: Path, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Back ``path`` up to a new ``FILE.orig[.N]`` (durably), then replace it with ``data``.

    Returns the backup's path. When anything fails, ``path`` is unchanged."""
    path = Path(path)
    backup = make_backup(path)
    try:
        write_file(path, data, encoding=encoding)
    except BaseException:
        # The source is untouched: a backup of it is only noise. Keep it if it cannot go.
        _remove(backup)
        raise
    return backup


def make_backup(path: Path) -> Path:
    """A new backup file holding exactly the bytes of ``path``; never overwrites one."""
    try:
        original = path.read_bytes()
        info = path.stat()
    except OSError as exc:
        raise WriteError(f"cannot read {path} to back it up: {_why(exc)}") from exc
    if _read_only(path, info):
        raise WriteError(f"cannot fix {path}: the file is read-only")
    temp = _write_temp(path, original, like=info)
    try:
        backup = _link_to_free_name(temp, path)
    finally:
        _remove(temp)
    _fsync_folder(path.parent)
    try:
        if backup.read_bytes() != original:  # paranoia: a backup we cannot trust is none
            raise WriteError(f"backup {backup} does not match {path}; nothing was changed")
    except OSError as exc:
        raise WriteError(f"cannot check backup {backup}: {_why(exc)}") from exc
    return backup


def check_fixable(path: Path) -> None:
    """Raise the ``WriteError`` that ``replace_with_backup`` would raise for a read-only
    ``path`` or folder, before anything is written (``--fix`` writes several files or none)."""
    path = Path(os.path.realpath(path))
    try:
        info, folder_info = path.stat(), path.parent.stat()
    except OSError as exc:
        raise WriteError(f"cannot fix {path}: {_why(exc)}") from exc
    if _read_only(path, info):
        raise WriteError(f"cannot fix {path}: the file is read-only")
    if _read_only(path.parent, folder_info):
        raise WriteError(f"cannot write {path}: the folder {path.parent} is read-only")


def backup_names(path: Path) -> list[Path]:
    """The names a backup of ``path`` may take, in the order they are tried."""
    base = path.with_name(path.name + ".orig")
    return [base, *(path.with_name(f"{path.name}.orig.{n}") for n in range(1, MAX_BACKUPS))]


def _link_to_free_name(temp: Path, path: Path) -> Path:
    """Give the finished temporary file the first free backup name (no-clobber, atomic)."""
    for name in backup_names(path):
        try:
            os.link(temp, name)
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV):
                raise WriteError(f"cannot write backup {name}: {_why(exc)}") from exc
            if name.exists() or name.is_symlink():  # no hard links here: rename, unless taken
                continue
            try:
                os.rename(temp, name)
            except OSError as exc2:
                raise WriteError(f"cannot write backup {name}: {_why(exc2)}") from exc2
        return name
    raise WriteError(
        f"cannot back up {path}: {path.name}.orig and {MAX_BACKUPS - 1} numbered backups "
        "exist already; remove old ones or use --no-backup"
    )


def _write_stream(path: Path, payload: bytes) -> None:
    try:
        with open(path, "wb") as out:
            out.write(payload)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {_why(exc)}") from exc


def _write_temp(path: Path, payload: bytes, *, like: os.stat_result | None) -> Path:
    """A fsynced temporary file next to ``path`` with ``payload``, mode (and owner) of ``like``."""
    folder = path.parent
    try:
        folder_info = folder.stat()
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {_why(exc)}") from exc
    if _read_only(folder, folder_info):
        raise WriteError(f"cannot write {path}: the folder {folder} is read-only")
    try:
        handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".nan-hunter", dir=folder)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise WriteError(f"cannot write {path}: the folder {folder} is read-only") from exc
        raise WriteError(f"cannot write {path}: {_why(exc)}") from exc
    temp = Path(name)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        if like is not None:
            os.chmod(temp, stat.S_IMODE(like.st_mode))
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                os.chown(temp, like.st_uid, like.st_gid)
        else:
            os.chmod(temp, 0o666 & ~_umask())
    except BaseException as exc:
        _remove(temp)
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write {path}: {_why(exc)}; nothing was changed") from exc
        raise
    return temp


def _read_only(path: Path, info: os.stat_result) -> bool:
    """Not writable for us, or (for root, who may write anything) with no write bit at all."""
    no_write_bits = not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    return no_write_bits or not os.access(path, os.W_OK)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable; not every platform or filesystem allows it."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {_why(exc)}") from exc


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    return exc.strerror or str(exc)


def new_folder_name(base: Path, limit: int = MAX_BACKUPS) -> Path:
    """``base``, or ``base-1``, ``base-2``... : the first name nothing holds yet (a folder
    nan-hunter makes is never one that exists)."""
    for n in range(limit):
        candidate = base if n == 0 else base.with_name(f"{base.name}-{n}")
        if not candidate.exists() and not candidate.is_symlink():
            return candidate
    raise WriteError(f"cannot choose a folder name: {base.name} and {limit - 1} numbered "
                     "ones exist already")


def write_new_folder(target: Path, files: Sequence[tuple[str, Callable[[BinaryIO], None]]]) -> int:
    """Create the folder ``target`` holding ``files`` (name, a writer of its bytes), whole or
    not at all: they are written and fsynced in a hidden folder beside it, which is then
    renamed to ``target``. ``target`` must not exist, or be an empty folder; nothing is
    written over. Returns the bytes written."""
    target = Path(target)
    if target.is_symlink() or (target.exists() and (not target.is_dir() or any(target.iterdir()))):
        raise WriteError(f"refusing to write into {target}: it exists and is not an empty folder")
    parent = target.parent
    if not parent.is_dir():
        raise WriteError(f"cannot write {target}: no folder {parent}")
    try:
        temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".nan-hunter", dir=parent))
    except OSError as exc:
        raise WriteError(f"cannot write {target}: {_why(exc)}") from exc
    total = 0
    try:
        for name, write in files:
            path = temp / name
            with open(path, "xb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
            total += path.stat().st_size
        os.chmod(temp, 0o777 & ~_umask())
        _fsync_folder(temp)
        os.rename(temp, target)  # atomic; onto an empty folder or none (POSIX)
    except BaseException as exc:
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write {target}: {_why(exc)}; nothing was written") from exc
        raise
    _fsync_folder(parent)
    return total
