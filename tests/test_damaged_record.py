"""A damaged record: every reader answers within a bounded time with one line naming the file and the
table, and never changes the file (issue 31 item 3).

The damage is made the way a disk or a torn write makes it: a byte of HDF5 metadata changed, so its
checksum no longer matches. A file whose superblock says a writer holds it (a running job, or one
killed with the file open) must be read as an SWMR reader, and HDF5 retries such a block for ever
there (the hang of the issue); :func:`held` marks a closed file that way, as a killed writer leaves it.
"""
from __future__ import annotations

import hashlib
import shutil
import sys
import time
from pathlib import Path

import h5py
import pytest

from hpcrl.cli import main as hpcrl_main
from hpcrl.io import (RecordDamagedError, RunFileError, follow, probe, read_attrs, read_table, read_trajectories,
                      read_trajectory, traj_filename)
from hpcrl.io.readers import read_row_counts
from hpcrl.io.recovery import lookup3, writer_has_open

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_run import write_synthetic_run  # noqa: E402

LIMIT_S = 1.5  # HPCRL_READ_TIMEOUT in the tests that wait for it


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    write_synthetic_run(run_dir, rounds=3, actors=2)
    return run_dir


@pytest.fixture
def run_dir(clean_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(clean_run, copy)
    return copy


def header_address(path: Path, name: str, swmr: bool = False) -> tuple[int, int]:
    """(address, length) of the first chunk of object ``name``'s header (version 2: ``OHDR``, checksummed);
    ``swmr``: the file is still open for writing by a (stopped) writer."""
    with h5py.File(path, "r", swmr=swmr, locking=False) as f:
        at = h5py.h5o.get_info(f[name].id).addr
    raw = path.read_bytes()
    assert raw[at:at + 4] == b"OHDR"
    flags = raw[at + 5]
    start = at + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    width = 1 << (flags & 3)
    size = int.from_bytes(raw[start:start + width], "little")
    return at, start + width + size + 4 - at  # through the checksum


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0x5A]))


def damage_header(path: Path, name: str) -> None:
    """Change one byte in the middle of object ``name``'s header: its checksum no longer matches."""
    at, length = header_address(path, name)
    flip(path, at + length // 2)


def held(path: Path) -> None:
    """Set the superblock's write flags (and its checksum), as a writer killed with the file open leaves them."""
    with open(path, "r+b") as fh:
        block = bytearray(fh.read(48))
        end = 12 + 4 * block[9]  # version 3 superblock at 0: checksum after four addresses
        block[11] = 0x05  # write access | SWMR write access
        block[end:end + 4] = lookup3(bytes(block[:end])).to_bytes(4, "little")
        fh.seek(0)
        fh.write(block[:end + 4])
    assert writer_has_open(path)


def digest(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*.h5"))}


def one_line(exc: BaseException, *parts: str) -> str:
    msg = str(exc)
    assert "\n" not in msg and all(p in msg for p in parts), msg
    return msg


def timed(fn, *args, **kwargs):
    start = time.monotonic()
    try:
        fn(*args, **kwargs)
    except RunFileError as exc:
        return exc, time.monotonic() - start
    raise AssertionError(f"{fn.__name__} read a damaged file without an error")


def test_a_damaged_table_is_named_at_once_and_the_others_still_read(run_dir):
    h5 = run_dir / "run.h5"
    damage_header(h5, "episodes")
    before = digest(run_dir)
    exc, seconds = timed(read_table, run_dir, "episodes")
    assert isinstance(exc, RecordDamagedError) and exc.table == "episodes" and seconds < 1.0
    one_line(exc, str(h5), "table 'episodes' is damaged", "checksum")
    exc, _ = timed(read_row_counts, h5)
    one_line(exc, str(h5), "table 'episodes' is damaged")
    with pytest.raises(RecordDamagedError, match="table 'episodes' is damaged"):
        next(follow(run_dir, "episodes", idle_seconds=0))
    assert len(read_table(run_dir, "updates")["version"]) > 0
    assert read_attrs(run_dir)["schema_version"] >= 1
    assert digest(run_dir) == before


def test_a_damaged_column_names_its_table(run_dir):
    damage_header(run_dir / "run.h5", "gradients/staleness")
    exc, seconds = timed(read_table, run_dir, "gradients")
    one_line(exc, "table 'gradients' is damaged")
    assert seconds < 1.0


def test_damaged_data_and_a_damaged_superblock_are_one_line(run_dir, tmp_path):
    h5 = run_dir / "run.h5"
    with h5py.File(h5, "r", locking=False) as f:
        chunk = f["episodes/return"].id.get_chunk_info(0)
    flip(h5, chunk.byte_offset + chunk.size // 2)  # compressed rows: the filter fails
    exc, _ = timed(read_table, run_dir, "episodes")
    one_line(exc, "table 'episodes' is damaged")

    bad = tmp_path / "superblock.h5"
    shutil.copy(h5, bad)
    flip(bad, 30)  # an address inside the superblock: its checksum fails
    exc, seconds = timed(read_table, bad, "episodes")
    assert isinstance(exc, RecordDamagedError) and exc.table is None and seconds < 1.0
    one_line(exc, str(bad), "file is damaged", "checksum")


def root_link_heap(path: Path) -> int:
    """Address of the fractal heap holding the root group's links (its Link Info message, type 0x02)."""
    raw = path.read_bytes()
    at, length = header_address(path, "/")
    flags = raw[at + 5]
    p = at + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0) + (1 << (flags & 3))
    while p < at + length - 4:
        kind, size = raw[p], int.from_bytes(raw[p + 1:p + 3], "little")
        body = p + 4 + (2 if flags & 0x04 else 0)
        if kind == 0x02:
            q = body + 2 + (8 if raw[body + 1] & 1 else 0)
            return int.from_bytes(raw[q:q + 8], "little")
        p = body + size
    raise AssertionError("no link info message: the root group keeps its links in its header")


def test_the_root_groups_damaged_links_are_the_file(run_dir):
    h5 = run_dir / "run.h5"
    heap = root_link_heap(h5)  # more tables than fit in a header: the links live in a heap and a B-tree
    assert h5.read_bytes()[heap:heap + 4] == b"FRHP"
    flip(h5, heap + 30)
    exc, _ = timed(read_table, run_dir, "episodes")
    one_line(exc, str(h5), "file is damaged")
    exc, _ = timed(read_row_counts, h5)
    one_line(exc, "file is damaged")


def test_damaged_trajectory_files_name_the_actor_file_and_dataset(run_dir):
    actor = run_dir / traj_filename(1)
    damage_header(actor, "obs")
    exc, seconds = timed(read_trajectory, actor)
    one_line(exc, str(actor), "dataset 'obs' is damaged")
    exc, _ = timed(read_trajectories, run_dir)  # the view itself says only "Unable to get dataspace"
    one_line(exc, str(actor), "dataset 'obs' is damaged")
    assert seconds < 1.0


@pytest.mark.slow
def test_a_held_damaged_file_is_reported_within_the_limit(run_dir, monkeypatch):
    h5 = run_dir / "run.h5"
    damage_header(h5, "episodes")
    held(h5)
    before = digest(run_dir)
    monkeypatch.setenv("HPCRL_READ_TIMEOUT", str(LIMIT_S))
    exc, seconds = timed(read_table, run_dir, "episodes")
    assert isinstance(exc, RecordDamagedError) and exc.table == "episodes"
    one_line(exc, str(h5), "table 'episodes' is damaged", f"after {LIMIT_S:g} s", "HPCRL_READ_TIMEOUT")
    assert LIMIT_S <= seconds < LIMIT_S + 3.0
    assert digest(run_dir) == before


@pytest.mark.slow
def test_a_held_file_damaged_elsewhere_still_reads_what_is_asked(run_dir, monkeypatch):
    h5 = run_dir / "run.h5"
    damage_header(h5, "elastic_events")
    held(h5)
    monkeypatch.setenv("HPCRL_READ_TIMEOUT", str(LIMIT_S))
    assert len(read_table(run_dir, "updates")["version"]) > 0  # the whole file times out, then 'updates' alone reads


def test_a_held_undamaged_file_is_checked_once_per_state(run_dir, monkeypatch):
    h5 = run_dir / "run.h5"
    episodes_at = header_address(h5, "episodes")[0]
    held(h5)
    children = []
    real = probe._run
    monkeypatch.setattr(probe, "_run", lambda targets, limit: children.append(targets) or real(targets, limit))
    first = read_table(run_dir, "episodes")
    assert len(read_table(run_dir, "rounds")["round"]) > 0 and read_attrs(run_dir)
    assert len(children) == 1 and children[0][0][1] is None  # the whole file, once
    assert (first["return"] == read_table(run_dir, "episodes")["return"]).all()
    flip(h5, episodes_at + 4)  # the header's version: the file changed, is checked again, and fails at once
    exc, seconds = timed(read_table, run_dir, "episodes")
    assert len(children) == 2 and seconds < 2.0
    one_line(exc, str(h5), "table 'episodes' is damaged", "version")


def test_analyze_names_the_damaged_table_and_exits_2(run_dir, capsys):
    damage_header(run_dir / "run.h5", "episodes")
    before = digest(run_dir)
    start = time.monotonic()
    assert hpcrl_main(["analyze", str(run_dir), "--no-figures", "--out", str(run_dir / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert f"{run_dir / 'run.h5'}: table 'episodes' is damaged" in err and "checksum" in err, err
    assert time.monotonic() - start < 2.0
    assert digest(run_dir) == before


@pytest.mark.slow
def test_analyze_of_a_held_damaged_file_ends_within_the_limit(run_dir, capsys, monkeypatch):
    h5 = run_dir / "run.h5"
    damage_header(h5, "episodes")
    held(h5)
    monkeypatch.setenv("HPCRL_READ_TIMEOUT", str(LIMIT_S))
    start = time.monotonic()
    assert hpcrl_main(["analyze", str(run_dir), "--no-figures", "--out", str(run_dir / "out")]) == 2
    seconds = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{h5}: table 'episodes' is damaged" in err and "HPCRL_READ_TIMEOUT" in err, err
    assert LIMIT_S <= seconds < LIMIT_S + 3.0
