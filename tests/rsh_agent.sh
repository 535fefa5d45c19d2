#!/bin/sh
# Stands in for ssh in the two-host test: Open MPI calls "agent HOST COMMAND...",
# and this runs COMMAND here, so 127.0.0.2 and 127.0.0.3 act as two nodes.
# Both fake nodes have this machine's node name, so their Open MPI daemons would
# share one session directory and race on it (a "File exists" mkdir failure, or a
# segfault writing the shared hwloc topology file). A directory per host keeps
# them apart, as separate machines would, and one per mpirun ($PPID) keeps the
# jobs of tests running side by side apart.
host=$1
shift
OMPI_MCA_orte_tmpdir_base="${TMPDIR:-/tmp}/rsh_agent.$PPID.$host"
export OMPI_MCA_orte_tmpdir_base
mkdir -p "$OMPI_MCA_orte_tmpdir_base"
exec sh -c "$*"
