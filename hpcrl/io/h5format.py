"""The HDF5 file format every file of the record is written in: HDF5 1.10's, so HDF5 1.10+ tools read it.

``libver="latest"`` means "the newest format this HDF5 library knows": with the h5py 3.16 wheel
(HDF5 2.0) that encodes chunked datasets with a layout message HDF5 1.10-1.14 cannot decode
(h5dump 1.10.8: ``bad version number for layout message``), so what a site's tools could open
depended on which h5py wheel pip picked. Pinning both bounds to ``v110`` keeps what the record
needs from 1.10's format (SWMR, virtual datasets, superblock version 3 with its write flags)
and nothing newer, whichever HDF5 writes it.

- :data:`WRITE_LIBVER`: every new file (run.h5, traj/actor-NNNNN.h5, the ClusterEnv record).
- :data:`APPEND_LIBVER`: reopening an existing file to append or cut it (resume, rollback). The
  lower bound is the same, so what is added is 1.10's format; the upper bound stays open so that
  a file an older hpcrl wrote in HDF5 2.0's format can still be resumed (``hpcrl convert RUN_DIR``
  rewrites such a run for older readers).
"""
from __future__ import annotations

WRITE_LIBVER = ("v110", "v110")
APPEND_LIBVER = ("v110", "latest")
