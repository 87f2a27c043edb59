"""A data directory as a node finds it at start-up: made if missing,
writable, and private to its owner.

What a data directory holds is for its owner alone: every message body
(the commit log, delay/*.log), and ids/secret, the key of the id index's
hash, with which anyone could choose msgIds that all fall in one slot
group and slow down every send (storage.id_index). So the store makes
every file FILE_MODE (0600) and every directory DIR_MODE (0700) whatever
the umask (storage.fileutil), and a node refuses to start on a directory
that group or others have any permission on: one an older release made
under umask 022 (0755, its files 0644), or one opened up by hand, until
`private_command` (`chmod -R go-rwx DIR`) has made it private.

Only the directory and the entries directly in it are looked at, not the
thousands of hour files below them: a directory made open has its top
entries open too, and the one command makes everything private.
"""

from __future__ import annotations

import os
import shlex
import stat

from .errors import DataDirError
from .fileutil import make_dir

# Permission bits that let group or others in: read, write, or search.
SHARED_BITS = 0o077


def prepare(directory: str) -> None:
    """Make `directory` (DIR_MODE) if it is missing, then raise
    DataDirError unless it is a directory, on a file system mounted
    read-write, that this process may read and write."""
    try:
        make_dir(directory)
    except FileExistsError:
        raise DataDirError(f"the data directory {directory} exists and is not a directory") from None
    except OSError as e:
        raise DataDirError(f"cannot create the data directory {directory}: {e.strerror}") from None
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        raise DataDirError(f"the data directory {directory} is on a read-only file system: mount it read-write")
    if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):
        raise DataDirError(f"the data directory {directory} is not readable and writable by this user "
                           f"(uid {os.getuid()}): chown it to that user, or run as its owner")


def shared_entries(directory: str) -> list[tuple[str, int]]:
    """(path, permission bits) of `directory` and of each entry directly in
    it that group or others have any permission on, the directory first
    (a symbolic link is judged by what it names). Empty: all private."""
    found = []
    for path in (directory, *(os.path.join(directory, name) for name in sorted(os.listdir(directory)))):
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:  # deleted meanwhile, or a link to nothing
            continue
        if mode & SHARED_BITS:
            found.append((path, mode))
    return found


def private_command(directory: str) -> str:
    """The shell command that takes every permission of group and others
    off `directory` and everything in it."""
    return f"chmod -R go-rwx {shlex.quote(directory)}"
