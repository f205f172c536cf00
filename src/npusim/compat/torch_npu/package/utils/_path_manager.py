"""``torch_npu.utils._path_manager``: torch_npu's checked file-system helpers, which its tests use to
make and remove their output folders.

The contract is torch_npu's: the ``check_*`` methods warn (never raise) on a symbolic link, an
over-long path or name, characters outside letters, digits, CJK, ``._-~/`` and white space, or a
path not readable / writable; they raise RuntimeError when a file is given for a folder or a
folder for a file, or when a folder to check does not exist. ``make_dir_safety`` /
``create_file_safety`` create with torch_npu's modes (0o750 / 0o640) and do nothing when the path
exists; ``remove_*_safety`` do nothing when it does not; a failing system call raises
RuntimeError naming the path.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Callable

__all__ = ["PathManager"]

_ALLOWED = re.compile(r"[.\/_\-\s~0-9a-zA-Z\u4e00-\u9fa5]+")


class PathManager:
    MAX_PATH_LENGTH = 4096
    MAX_FILE_NAME_LENGTH = 255
    DATA_FILE_AUTHORITY = 0o640
    DATA_DIR_AUTHORITY = 0o750

    @classmethod
    def _input_path_common_check(cls, path: str) -> None:
        """Warns about what torch_npu deems a suspicious path; the path need not exist."""
        if len(path) > cls.MAX_PATH_LENGTH or any(len(part) > cls.MAX_FILE_NAME_LENGTH for part in path.split("/")):
            warnings.warn(f"Length of input path exceeds the limit ({cls.MAX_PATH_LENGTH} for the path, "
                          f"{cls.MAX_FILE_NAME_LENGTH} for a name): {path[:80]}...", stacklevel=3)
        if os.path.islink(path):
            warnings.warn(f"Invalid input path is a symbolic link: {path}", stacklevel=3)
        if not _ALLOWED.fullmatch(path):
            warnings.warn(f"Invalid input path: {path}", stacklevel=3)

    @classmethod
    def check_input_directory_path(cls, path: str) -> None:
        cls._input_path_common_check(path)
        if os.path.isfile(path):
            raise RuntimeError(f"PathManager.check_input_directory_path: expected a directory, got a file: {path}")

    @classmethod
    def check_input_file_path(cls, path: str) -> None:
        cls._input_path_common_check(path)
        if os.path.isdir(path):
            raise RuntimeError(f"PathManager.check_input_file_path: expected a file, got a directory: {path}")

    @classmethod
    def _check_access(cls, op: str, path: str, mode: int) -> None:
        if not os.path.exists(path):
            raise RuntimeError(f"PathManager.{op}: the path does not exist: {path}")
        if os.path.islink(path):
            warnings.warn(f"Invalid path is a symbolic link: {path}", stacklevel=3)
        if not os.access(path, mode):
            warnings.warn(f"The path permission check failed: {path}", stacklevel=3)

    @classmethod
    def check_directory_path_writeable(cls, path: str) -> None:
        cls._check_access("check_directory_path_writeable", path, os.W_OK)

    @classmethod
    def check_directory_path_readable(cls, path: str) -> None:
        cls._check_access("check_directory_path_readable", path, os.R_OK)

    @classmethod
    def check_path_is_readable(cls, path: str) -> bool:
        return os.access(path, os.R_OK)

    @classmethod
    def check_path_is_writeable(cls, path: str) -> bool:
        return os.access(path, os.W_OK)

    @classmethod
    def _system_call(cls, what: str, path: str, call: Callable[[], object]) -> None:
        if os.path.islink(path):
            warnings.warn(f"{what}: {path} is a symbolic link", stacklevel=3)
        try:
            call()
        except FileNotFoundError:
            return  # removed meanwhile: what was asked holds
        except OSError as err:
            raise RuntimeError(f"PathManager: {what} {path} failed: {err}") from err

    @classmethod
    def remove_path_safety(cls, path: str) -> None:
        if os.path.exists(path):
            cls._system_call("removing the directory", path, lambda: shutil.rmtree(path))

    @classmethod
    def remove_file_safety(cls, file: str) -> None:
        if os.path.exists(file):
            cls._system_call("removing the file", file, lambda: os.remove(file))

    @classmethod
    def make_dir_safety(cls, path: str) -> None:
        if not os.path.exists(path):
            cls._system_call("making the directory", path,
                             lambda: os.makedirs(path, mode=cls.DATA_DIR_AUTHORITY, exist_ok=True))

    @classmethod
    def create_file_safety(cls, path: str) -> None:
        if not os.path.exists(path):
            cls._system_call("creating the file", path,
                             lambda: os.close(os.open(path, os.O_WRONLY | os.O_CREAT, cls.DATA_FILE_AUTHORITY)))
