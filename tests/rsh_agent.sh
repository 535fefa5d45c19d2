#!/bin/sh
# Stands in for ssh in the two-host test: Open MPI calls "agent HOST COMMAND...",
# and this runs COMMAND here, so 127.0.0.2 and 127.0.0.3 act as two nodes. Each
# runs in a UTS namespace of its own named after its address, as two machines
# have names of their own: Open MPI 5 takes daemons that report one host name
# for one node, and Open MPI 4's daemons would share one session directory
# (named after the node) and race on it.
host=$1
shift
exec unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "node-$(echo "$host" | tr . -)" "$*"
