/* Raw-MPI ceiling for hpcrl's gradient push: Put + Flush of P floats into a window on rank 0.
 *
 * Rank 0 allocates one region of P floats per origin (MPI_Win_allocate); every other rank
 * repeatedly locks rank 0 shared, Puts its P-float buffer, Flushes (remote completion) and
 * unlocks, like GradientMailbox.push without the state word. Rank 0 keeps calling MPI
 * (MPI_Iprobe) so passive-target progress is not starved. Also measured on rank 0: memcpy of
 * the same buffer, the baseline the ratios use.
 *
 * usage: mpiexec -n K rma_put_bench [P floats, default 1048576] [seconds, default 1]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double memcpy_gbps(size_t bytes, double seconds)
{
    char *src = malloc(bytes), *dst = malloc(bytes);
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    long n = 0;
    double t0 = MPI_Wtime(), t;
    do {
        memcpy(dst, src, bytes);
        src[n % bytes] ^= 1; /* keep the compiler from dropping repeated copies */
        n++;
    } while ((t = MPI_Wtime() - t0) < seconds);
    volatile char sink = dst[bytes / 2];
    (void)sink;
    free(src);
    free(dst);
    return (double)bytes * n / t / 1e9;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long P = argc > 1 ? atol(argv[1]) : 1L << 20;
    double seconds = argc > 2 ? atof(argv[2]) : 1.0;
    size_t bytes = (size_t)P * sizeof(float);
    if (size < 2) {
        if (rank == 0) fprintf(stderr, "rma_put_bench: needs at least 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    float *base = NULL;
    MPI_Win win;
    MPI_Aint winsize = rank == 0 ? (MPI_Aint)bytes * (size - 1) : 0;
    MPI_Win_allocate(winsize, sizeof(float), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);

    double memcpy_rate = 0.0;
    if (rank == 0) memcpy_rate = memcpy_gbps(bytes, seconds / 2);
    MPI_Barrier(MPI_COMM_WORLD);

    long puts = 0;
    double elapsed = 0.0;
    if (rank == 0) {
        int done = 0, flag;
        while (done < size - 1) { /* drive progress until every origin reports */
            MPI_Iprobe(MPI_ANY_SOURCE, 7, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
            if (flag) {
                MPI_Recv(NULL, 0, MPI_BYTE, MPI_ANY_SOURCE, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                done++;
            }
        }
    } else {
        float *grad = malloc(bytes);
        for (long i = 0; i < P; i++) grad[i] = (float)rank;
        MPI_Aint disp = (MPI_Aint)(rank - 1) * P;
        double t0 = MPI_Wtime();
        do {
            MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
            MPI_Put(grad, (int)P, MPI_FLOAT, 0, disp, (int)P, MPI_FLOAT, win);
            MPI_Win_flush(0, win);
            MPI_Win_unlock(0, win);
            puts++;
        } while ((elapsed = MPI_Wtime() - t0) < seconds);
        MPI_Send(NULL, 0, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
        free(grad);
    }

    long total_puts = 0;
    double max_elapsed = 0.0;
    MPI_Reduce(&puts, &total_puts, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&elapsed, &max_elapsed, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    if (rank == 0) {
        /* check: region r holds the value r + 1 written by origin r + 1 */
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
        int ok = 1;
        for (int r = 0; r < size - 1; r++)
            ok &= base[(size_t)r * P] == (float)(r + 1) && base[(size_t)r * P + P - 1] == (float)(r + 1);
        MPI_Win_unlock(0, win);
        double put_rate = (double)bytes * total_puts / max_elapsed / 1e9;
        double per_put_us = max_elapsed / ((double)total_puts / (size - 1)) * 1e6;
        printf("%-28s %12s %12s %10s\n", "path", "GB/s", "us/op", "x memcpy");
        printf("%-28s %12.2f %12.1f %10.2f\n", "memcpy (rank 0)", memcpy_rate, bytes / memcpy_rate / 1e3, 1.0);
        printf("%-28s %12.2f %12.1f %10.2f\n", "MPI Put+Flush (aggregate)", put_rate, per_put_us,
               put_rate / memcpy_rate);
        printf("# P=%ld floats (%.1f MB), %d origins, %ld puts, data %s\n", P, bytes / 1e6, size - 1, total_puts,
               ok ? "verified" : "WRONG");
        if (!ok) MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Win_free(&win);
    MPI_Finalize();
    return 0;
}
