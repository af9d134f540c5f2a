"""Deprecated: moved to :mod:`oodutils.fileio`. Importing this module warns and gives the same
objects, so old imports keep working for one more release."""
import warnings

from oodutils.fileio import (  # noqa: F401
    atomic_move_aside,
    atomic_savez,
    atomic_torch_save,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    check_output_path,
    current_umask,
    finite_json,
    fsync_directory,
)

__all__ = ["atomic_move_aside", "atomic_savez", "atomic_torch_save", "atomic_write_bytes",
           "atomic_write_json", "atomic_write_text", "check_output_path", "current_umask",
           "finite_json", "fsync_directory"]

warnings.warn("domainbed.fileio is deprecated: import from oodutils.fileio",
              DeprecationWarning, stacklevel=2)
