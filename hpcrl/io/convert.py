"""Rewrite a run's HDF5 files in the record's format (HDF5 1.10's: :mod:`hpcrl.io.h5format`), for older readers.

hpcrl once wrote with ``libver="latest"``, which under the h5py 3.16 wheel is HDF5 2.0's format
(HDF5 1.10-1.14 tools cannot open its datasets). :func:`convert_file` copies one file into a new
file with :data:`~hpcrl.io.h5format.WRITE_LIBVER` bounds, object by object: every group,
attribute (with its stored type), dataset (same shape, maximum shape, chunks, filters, fill value
and virtual mappings, then its data copied in row blocks), and the live row counts a file from before them lacks
(``committed/<table>``, ``committed/steps``). The new file replaces the old one with
``os.replace`` only when complete. Run it with no job writing the run (``convert_run`` takes the
run lock).

API::

    convert_file(path, libver=WRITE_LIBVER) -> None
    convert_run(run_dir) -> list[Path]      # run.h5 and traj/actor-*.h5, under the run lock
"""
from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from hpcrl.io.errors import RunFileError
from hpcrl.io.h5format import WRITE_LIBVER
from hpcrl.io.recovery import clear_write_flags
from hpcrl.io.schema import RUN_FILE, TABLES, TRAJ_FIELD_NAMES
from hpcrl.io.tables import COMMITTED_ROWS, COMMITTED_STEPS, LIVE_GROUP, committed_length, set_live_count
from hpcrl.io.traj_file import LIVE_STEPS

BLOCK_BYTES = 64 << 20


def _copy_attrs(src, dst) -> None:
    for name in src.attrs:
        dst.attrs.create(name, src.attrs[name], dtype=src.attrs.get_id(name).dtype)


def _creation_plist(src: h5py.Dataset):
    """A fresh dataset creation property list with the source's chunks, filters, fill value and virtual
    mappings (the source's own list also carries its layout message version, which the new bounds refuse)."""
    old, new = src.id.get_create_plist(), h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    layout = old.get_layout()
    if layout == h5py.h5d.CHUNKED:
        new.set_chunk(old.get_chunk())
        for i in range(old.get_nfilters()):
            code, flags, values, _ = old.get_filter(i)
            new.set_filter(code, flags, values)
    elif layout == h5py.h5d.VIRTUAL:
        for i in range(old.get_virtual_count()):
            new.set_virtual(old.get_virtual_vspace(i), old.get_virtual_filename(i).encode(),
                            old.get_virtual_dsetname(i).encode(), old.get_virtual_srcspace(i))
    if old.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED:
        fill = np.zeros(1, src.dtype)
        old.get_fill_value(fill)
        new.set_fill_value(fill)
    return new


def _copy_dataset(src: h5py.Dataset, dst_group: h5py.Group, name: str) -> None:
    dcpl = _creation_plist(src)
    h5py.h5d.create(dst_group.id, name.encode(), src.id.get_type(), src.id.get_space(), dcpl=dcpl)
    dst = dst_group[name]
    if not src.is_virtual and src.size:
        row = max(1, src.dtype.itemsize * int(np.prod(src.shape[1:], dtype=np.int64)))
        step = max(1, BLOCK_BYTES // row)
        for lo in range(0, src.shape[0], step):
            dst[lo:lo + step] = src[lo:lo + step]
    _copy_attrs(src, dst)


def _copy_group(src: h5py.Group, dst: h5py.Group) -> None:
    _copy_attrs(src, dst)
    for name in src:
        link = src.get(name, getlink=True)
        if not isinstance(link, h5py.HardLink):
            raise RunFileError(f"{src.file.filename}: {src.name}/{name} is a soft or external link; hpcrl files have none")
        obj = src[name]
        if isinstance(obj, h5py.Group):
            _copy_group(obj, dst.create_group(name))
        else:
            _copy_dataset(obj, dst, name)


def _add_live_counts(f: h5py.File) -> None:
    """The committed/<...> datasets of a file written before they existed (from its committed attributes)."""
    for name in TABLES:
        if name in f and f"{LIVE_GROUP}/{name}" not in f and COMMITTED_ROWS in f[name].attrs:
            set_live_count(f, name, int(f[name].attrs[COMMITTED_ROWS]))
    if COMMITTED_STEPS in f.attrs and f"{LIVE_GROUP}/{LIVE_STEPS}" not in f:
        lengths = (f[k].shape[0] for k in TRAJ_FIELD_NAMES if k in f)
        set_live_count(f, LIVE_STEPS, committed_length(f, lengths, COMMITTED_STEPS))


def convert_file(path: str | Path, libver=WRITE_LIBVER) -> None:
    """Rewrite ``path`` in place with ``libver`` bounds (default: the record's 1.10 format)."""
    path = Path(path)
    if not path.is_file():
        raise RunFileError(f"{path}: no such HDF5 file to convert")
    tmp = path.with_name(path.name + ".converting")
    try:
        clear_write_flags(path)  # a killed writer left them; nobody writes the file now
        with h5py.File(path, "r", locking=False) as src, h5py.File(tmp, "w", libver=libver, locking=False) as dst:
            _copy_group(src, dst)
            _add_live_counts(dst)
    except (OSError, ValueError, KeyError) as exc:
        tmp.unlink(missing_ok=True)
        raise RunFileError(f"{path}: cannot be converted ({str(exc).splitlines()[0]})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def convert_run(run_dir: str | Path) -> list[Path]:
    """Rewrite run.h5 and every traj/actor-*.h5 of ``run_dir`` in the record's format; the files rewritten."""
    from hpcrl.io.rollback import trajectory_files
    from hpcrl.io.run_lock import RunLock

    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunFileError(f"{run_dir}: no such run directory or file")
    if not (run_dir / RUN_FILE).is_file():
        raise RunFileError(f"{run_dir}: not a run directory (no {RUN_FILE})")
    files = [run_dir / RUN_FILE, *trajectory_files(run_dir).values()]
    with RunLock(run_dir):  # no job may write the files while they are replaced
        for p in files:
            convert_file(p)
    return files
