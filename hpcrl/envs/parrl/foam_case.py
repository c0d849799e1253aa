"""OpenFOAM case directories: find the install, copy a tutorial, edit dictionaries, run, parse.

Nothing here trusts a solver: a run reports its exit status, whether it timed out, and the log;
`parse_solver_log` and `read_vector_field` raise `FoamOutputError` on anything they cannot read.
Solvers run in their own session (process group), so a timeout kills the whole group.
"""
from __future__ import annotations

import functools
import glob
import math
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INSTALL_HINT = ("install it with `apt-get install openfoam openfoam-examples` (Debian/Ubuntu, OpenFOAM v1912), "
                "or pass foam_bashrc= and tutorial= for another install")
BASHRC_CANDIDATES = ("/usr/share/openfoam/etc/bashrc", "/usr/lib/openfoam/openfoam*/etc/bashrc",
                     "/opt/openfoam*/etc/bashrc")
PITZDAILY = "incompressible/simpleFoam/pitzDaily"
TUTORIAL_ROOTS = ("/usr/share/doc/openfoam-examples/examples", "/usr/lib/openfoam/openfoam*/tutorials",
                  "/opt/openfoam*/tutorials")


class FoamNotInstalledError(RuntimeError):
    """OpenFOAM (or the tutorial case) is not where we looked."""


class FoamOutputError(RuntimeError):
    """A log or field file is missing, truncated or garbled."""


def _first(patterns: tuple[str, ...], suffix: str = "") -> Path | None:
    for pattern in patterns:
        for hit in sorted(glob.glob(pattern + suffix)):
            return Path(hit)
    return None


def find_bashrc(bashrc: str | os.PathLike | None = None) -> Path | None:
    if bashrc is not None:
        return Path(bashrc) if Path(bashrc).is_file() else None
    return _first(BASHRC_CANDIDATES)


def find_tutorial(tutorial: str | os.PathLike | None = None, case: str = PITZDAILY) -> Path | None:
    if tutorial is not None:
        return Path(tutorial) if (Path(tutorial) / "system" / "controlDict").is_file() else None
    hit = _first(TUTORIAL_ROOTS, "/" + case)
    return hit if hit is not None and (hit / "system" / "controlDict").is_file() else None


@functools.lru_cache(maxsize=None)
def foam_environment(bashrc: str) -> dict[str, str]:
    """The environment after sourcing OpenFOAM's bashrc in a bash subprocess (once per process)."""
    try:
        out = subprocess.run(["bash", "-c", f'source "{bashrc}" >/dev/null 2>&1; env -0'],
                             capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise FoamNotInstalledError(f"sourcing {bashrc} failed ({e}); {INSTALL_HINT}") from e
    env = dict(item.split("=", 1) for item in out.decode(errors="replace").split("\0") if "=" in item)
    if "WM_PROJECT_DIR" not in env:
        raise FoamNotInstalledError(f"{bashrc} did not set WM_PROJECT_DIR; {INSTALL_HINT}")
    return env


# ---------------------------------------------------------------------- dictionary editing

def _block_span(text: str, name: str, start: int = 0) -> tuple[int, int]:
    """(index after the opening brace, index of the closing brace) of the first `name { ... }`."""
    m = re.compile(r"(^|[\s;{}])" + re.escape(name) + r"\s*\{", re.M).search(text, start)
    if m is None:
        raise FoamOutputError(f"no block {name!r}")
    depth, i = 1, m.end()
    while depth:
        if i >= len(text):
            raise FoamOutputError(f"unbalanced braces in block {name!r}")
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return m.end(), i - 1


def replace_block(text: str, path: list[str], body: str) -> str:
    """Replace the contents of nested block path[0] { path[1] { ... } }; the last one is added if absent."""
    lo, hi = 0, len(text)
    for i, name in enumerate(path):
        try:
            lo, hi = _block_span(text[:hi], name, lo)
        except FoamOutputError:
            if i < len(path) - 1:
                raise
            return text[:hi] + f"\n{name}\n{{\n{body}\n}}\n" + text[hi:]
    return text[:lo] + "\n" + body + "\n" + text[hi:]


def set_entry(text: str, key: str, value: str) -> str:
    """Set a top-level `key value;` entry (appended if absent)."""
    pattern = re.compile(r"^(\s*" + re.escape(key) + r"\s+)[^;]*;", re.M)
    if pattern.search(text):
        return pattern.sub(lambda m: m.group(1) + value + ";", text, count=1)
    return text.rstrip() + f"\n{key} {value};\n"


# ---------------------------------------------------------------------- log and fields

_TIME = re.compile(r"^Time = (\S+)\s*$", re.M)
_SOLVE = re.compile(r"Solving for (\w+), Initial residual = ([^,]+), Final residual = ([^,]+), No Iterations (\d+)")


@dataclass
class SolverLog:
    times: list[float]
    residuals: dict[str, float]  # initial residual of each field in the last iteration
    converged: bool  # the solver said "SIMPLE solution converged"
    ended: bool  # the log reached "End"
    fatal: str = ""  # FOAM FATAL ERROR / floating point exception text, if any

    @property
    def iterations(self) -> int:
        return len(self.times)


def parse_solver_log(text: str) -> SolverLog:
    """Iterations and last initial residuals from a simpleFoam log; raise on garbage."""
    marks = list(_TIME.finditer(text))
    fatal = ""
    for needle in ("FOAM FATAL", "FOAM aborting", "sigFpe::sigHandler", "Foam::error::printStack"):
        if needle in text:
            fatal = needle
            break
    if not marks:
        if fatal:
            return SolverLog([], {}, False, False, fatal)
        raise FoamOutputError("no 'Time =' line in the solver log")
    try:
        times = [float(m.group(1)) for m in marks]
    except ValueError as e:
        raise FoamOutputError(f"unreadable time in log: {e}") from e
    last = text[marks[-1].end():]
    residuals: dict[str, float] = {}
    for m in _SOLVE.finditer(last):
        name = m.group(1)
        if name not in residuals:  # first solve of the iteration (later ones are correctors)
            try:
                residuals[name] = float(m.group(2))
            except ValueError as e:
                raise FoamOutputError(f"unreadable residual {m.group(2)!r} for {name}") from e
    return SolverLog(times, residuals, "solution converged" in text, bool(re.search(r"^End\s*$", text, re.M)), fatal)


NUMBER = r"[-+0-9.eEnaifNAIF]+"  # also nan / inf, so they parse and are caught as non-finite


def _vectors(body: str, what: str) -> np.ndarray:
    """Values of `uniform (a b c)` or `nonuniform List<vector> N ( (a b c) ... )`."""
    m = re.match(r"\s*uniform\s*\(\s*(" + NUMBER + r")\s+(" + NUMBER + r")\s+(" + NUMBER + r")\s*\)", body)
    if m:
        try:
            return np.array([[float(g) for g in m.groups()]])
        except ValueError as e:
            raise FoamOutputError(f"non-numeric value in {what}") from e
    m = re.match(r"\s*nonuniform\s+List<vector>\s*(\d+)\s*\(", body)
    if m is None:
        raise FoamOutputError(f"cannot read {what}")
    n = int(m.group(1))
    end = body.find(";", m.end())
    flat = body[m.end():end].replace("(", " ").replace(")", " ").split()
    try:
        values = np.array(flat, dtype=float)
    except ValueError as e:
        raise FoamOutputError(f"non-numeric entries in {what}") from e
    if values.size != 3 * n:
        raise FoamOutputError(f"{what}: {values.size} numbers for {n} vectors")
    return values.reshape(n, 3)


def read_vector_field(path: Path, patch: str) -> tuple[np.ndarray, np.ndarray]:
    """(cell values, values on `patch`) of an ascii volVectorField file."""
    try:
        text = path.read_text()
    except OSError as e:
        raise FoamOutputError(f"cannot read {path}: {e}") from e
    return read_vector_field_text(text, patch, str(path))


def read_vector_field_text(text: str, patch: str, what: str = "field") -> tuple[np.ndarray, np.ndarray]:
    m = re.search(r"^internalField\s+", text, re.M)
    if m is None:
        raise FoamOutputError(f"{what}: no internalField")
    internal = _vectors(text[m.end():], f"{what} internalField")
    a, b = _block_span(text, "boundaryField")
    pa, pb = _block_span(text[:b], patch, a)
    v = re.search(r"(^|\s)value\s+", text[pa:pb])
    if v is None:
        raise FoamOutputError(f"{what}: patch {patch!r} has no value")
    return internal, _vectors(text[pa + v.end():pb], f"{what} {patch} value")


def parse_failure(text: str) -> str:
    """The most telling line of a failed solver log (FATAL message, exception) or its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if "FATAL" in ln or "sigFpe::sigHandler" in ln or "printStack" in ln:
            return " ".join(lines[i:i + 3])[:300]
    return lines[-1][:300] if lines else "empty log"


def time_dirs(case: Path) -> list[tuple[float, Path]]:
    out = []
    for p in case.iterdir():
        try:
            t = float(p.name)
        except ValueError:
            continue
        if p.is_dir() and math.isfinite(t):
            out.append((t, p))
    return sorted(out)


# ---------------------------------------------------------------------- running

@dataclass
class RunResult:
    returncode: int | None  # None when killed on timeout
    timed_out: bool
    log: Path
    wall_s: float
    pid: int = 0


def run_foam(app: str, case: Path, env: dict[str, str], log: Path, timeout_s: float) -> RunResult:
    """Run `app -case case` with stdout+stderr to `log`, in its own session; kill the group on timeout."""
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen([app, "-case", str(case)], stdout=out, stderr=subprocess.STDOUT,
                                    env={**env, "PWD": str(case)}, cwd=case, start_new_session=True)
        except OSError as e:
            out.write(f"could not start {app}: {e}\n".encode())
            return RunResult(127, False, log, time.perf_counter() - t0)
        try:
            rc = proc.wait(timeout=timeout_s)
            return RunResult(rc, False, log, time.perf_counter() - t0, proc.pid)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            return RunResult(None, True, log, time.perf_counter() - t0, proc.pid)


def copy_case(tutorial: Path, dest: Path) -> None:
    """Copy a tutorial's 0/, constant/ and system/ (no time directories, logs or meshes)."""
    dest.mkdir(parents=True, exist_ok=True)
    for part in ("0", "constant", "system"):
        if (dest / part).exists():
            shutil.rmtree(dest / part)
        shutil.copytree(tutorial / part, dest / part, ignore=shutil.ignore_patterns("polyMesh"))
