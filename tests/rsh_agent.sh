#!/bin/sh
# Stands in for ssh in the two-host test: Open MPI calls "agent HOST COMMAND...",
# and this runs COMMAND here, so 127.0.0.2 and 127.0.0.3 act as two nodes.
shift
exec sh -c "$*"
