/* What Open MPI alone needs to allreduce the small config's softmax-kernel
 * gradient (201 x 10000 floats, 8 MB) between two processes: the floor under
 * the bench's "collectives alone" rows. BENCHMARKS.md quotes its output.
 *
 *   mpicc -O2 scripts/mpi_allreduce_floor.c -o /tmp/mpi_allreduce_floor
 *   mpirun --allow-run-as-root -np 2 -bind-to none -mca pml ob1 -mca btl tcp,self /tmp/mpi_allreduce_floor
 *   mpirun --allow-run-as-root -np 2 -bind-to none -mca pml ob1 -mca btl vader,self /tmp/mpi_allreduce_floor
 *
 * "reused" allreduces one buffer in place, as a fusion buffer would; "fresh"
 * copies the input into a newly allocated buffer each time and scales it by
 * 1/2 afterwards, as Horovod's averaging allreduce of a new output tensor does.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT (201 * 10000)
#define WARMUP 5
#define TIMED 20

int main(int argc, char **argv) {
  int provided, rank;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  /* as Horovod asks */
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  float *input = malloc(COUNT * sizeof(float));
  float *reused = malloc(COUNT * sizeof(float));
  for (int i = 0; i < COUNT; i++) input[i] = reused[i] = (float)(i % 1000);

  double reused_ms = 0, fresh_ms = 0;
  for (int i = 0; i < WARMUP + TIMED; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, reused, COUNT, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (i >= WARMUP) reused_ms += (MPI_Wtime() - start) * 1e3;
  }
  for (int i = 0; i < WARMUP + TIMED; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    float *output = malloc(COUNT * sizeof(float));
    memcpy(output, input, COUNT * sizeof(float));
    MPI_Allreduce(MPI_IN_PLACE, output, COUNT, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int j = 0; j < COUNT; j++) output[j] *= 0.5f;
    free(output);
    if (i >= WARMUP) fresh_ms += (MPI_Wtime() - start) * 1e3;
  }
  if (rank == 0)
    printf("8 MB float allreduce, 2 ranks: reused buffer %.2f ms, fresh buffer + copy + scale %.2f ms\n",
           reused_ms / TIMED, fresh_ms / TIMED);
  free(input);
  free(reused);
  MPI_Finalize();
  return 0;
}
